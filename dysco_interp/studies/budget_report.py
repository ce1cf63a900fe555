"""The selection-budget study's summaries (pure: records in, rows out) and its tables.

DySCO boosts the keys its relevance selects: a nucleus of mass p, capped at K keys or at a
share of the prompt (`top_k_fraction`). The budget is swept on a dev split, teacher forced,
and the chosen configuration is reported on a test split.

- `budget_curves`: per (model, task, length, head kind, beta, p, budget) the paired gain of
  every teacher-forced metric over vanilla, with 95% bootstrap intervals and the number of
  keys actually boosted; `viz.budget_figure` draws them.
- `heldout_table` / `write_heldout_table`: Path Traversal per model and length: vanilla, UniAttnS,
  the paper preset, the chosen configuration and its random-head and static ablations.
- `dev_free_table` / `write_dev_free`: free generation on the dev split (vanilla, the paper
  preset, the teacher-forced shortlist) with paired differences to vanilla.
- `write_reports`: all of the above from the stores under a budget folder (`--figures-only`).

Records are grouped by what ran (`MethodKey`), never by their free-text label, so runs of
another schedule or template masking stay apart; they are paired by instance (content hash)
within (model, task, length).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dysco_interp.analysis.method_key import MethodKey
from dysco_interp.analysis.records import Sourced, check_comparable, display_path, read_sourced
from dysco_interp.analysis.report import DELTA_LEGEND, fmt_ci, fmt_delta, write_json, write_text
from dysco_interp.analysis.result_tables import (
    PAPER_PRESET,
    VANILLA,
    ByKey,
    CIOptions,
    by_cell,
    metric_estimates,
    paired_deltas,
    with_table_q,
)
from dysco_interp.decoding.config import KEYWORDS, param_values, preset
from dysco_interp.decoding.methods import FLAT_FIELDS
from dysco_interp.errors import ConfigError
from dysco_interp.stores.archives import stores_in
from dysco_interp.studies.budget_choice import choose_config
from dysco_interp.studies.budget_study import chosen_tau
from dysco_interp.tasks.path_traversal.spec import PATH_TRAVERSAL
from dysco_interp.tasks.registry import TASKS
from dysco_interp.viz.budget_figure import budget_figure
from dysco_interp.viz.tables import table_markdown

FALLBACK_METRIC = "tf_logprob"  # every teacher-forced store has it
# the answer-level scores every teacher-forced record carries (`ForcedScores.summary`)
FORCED_SUMMARY = ("tf_logprob", "tf_token_accuracy", "tf_exact")
HEAD_KINDS = {"dysco": "qrheads", "dysco-random": "random"}
# (metric, which records hold it, column title) of the test table
TEST_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("tf_step_accuracy", "tf", "TF step accuracy"),
    ("tf_city_logprob", "tf", "TF city log-prob"),
    ("accuracy", "free", "exact accuracy"),
    ("partial_accuracy", "free", "partial accuracy"),
    ("step_accuracy", "free", "step accuracy"),
)
ROLES = ("vanilla", "uniattns", "paper", "chosen", "random", "static")
NOT_RUN = "not run"


def is_teacher_forced(record: Mapping) -> bool:
    return bool((record.get("settings") or {}).get("teacher_forced"))


def budget_of(key: MethodKey) -> tuple[str, float]:
    """("fraction", f) when the selection is capped at a share of the prompt, else ("K", top_k)."""
    fraction = key.value("top_k_fraction")  # MethodKey writes None as 0.0
    return ("fraction", float(fraction)) if fraction else ("K", int(key.value("top_k")))


def mean_selected(records: Sequence[Mapping]) -> float | None:
    """Mean over records of the keys boosted per step (None when no record says)."""
    values = [float(r["mean_selected"]) for r in records if r.get("mean_selected") is not None]
    return round(sum(values) / len(values), 2) if values else None


# ---------------------------------------------------------------------------- dev curves


def forced_metrics(task: str) -> tuple[str, ...]:
    """Every teacher-forced metric a task's records carry, the task's primary one first."""
    spec = TASKS.get(task)
    if spec is None:
        return (FALLBACK_METRIC,)
    return tuple(dict.fromkeys((spec.metrics.primary_forced, *spec.metrics.forced, *FORCED_SUMMARY)))


def budget_curves(records: Iterable[Mapping], metric: str | None = None,
                  ci: CIOptions = CIOptions()) -> list[dict]:
    """One row per (model, task, length, head kind, beta, p, budget) of the teacher-forced records.

    `gain`: the paired gain over vanilla of `metric` (default: the task's primary one) with its
    95% bootstrap CI (None without vanilla on shared instances); `gains` and `means`: every
    teacher-forced metric; `vanilla`: vanilla's own means in the cell; `n`: paired instances of
    the gain; `mean_selected`: keys actually boosted per step. DySCO runs that also move decay,
    warm-up, schedule, template masking (or use another head seed) are rows of their own,
    named in `other`. Free-generation records are ignored.
    """
    cells, _ = by_cell(r for r in records if is_teacher_forced(r))
    rows = []
    for (model, task, length), by_key in cells.items():
        primary = metric or forced_metrics(task)[0]
        metrics = list(dict.fromkeys((primary, *forced_metrics(task))))
        vanilla = by_key.get(VANILLA, [])
        vanilla_means = metric_estimates(vanilla, metrics, ci) if vanilla else dict.fromkeys(metrics)
        for key, recs in by_key.items():
            if key.method not in HEAD_KINDS:
                continue
            budget = budget_of(key)
            gains = paired_deltas(recs, vanilla, metrics, ci) if vanilla else dict.fromkeys(metrics)
            gain = gains[primary]
            other = {k: v for k, v in key.deviations().items() if k not in ("beta", "top_p", "top_k", "top_k_fraction")}
            rows.append({
                "model": model, "task": task, "length": length, "heads": HEAD_KINDS[key.method],
                "beta": key.value("beta"), "top_p": key.value("top_p"), "budget": budget,
                "top_k": key.value("top_k"), "top_k_fraction": budget[1] if budget[0] == "fraction" else None,
                "head_seed": key.value("head_seed") if key.method == "dysco-random" else None,
                "other": other, "config_method": key.method, "params": key.params_dict(), "label": key.label,
                "metric": primary, "gain": gain, "n": gain["n"] if gain else 0,
                "n_records": len(recs), "n_vanilla": len(vanilla), "mean_selected": mean_selected(recs),
                "gains": gains, "means": metric_estimates(recs, metrics, ci), "vanilla": vanilla_means,
            })
    rows.sort(key=lambda r: (r["model"], r["task"], r["length"], r["heads"] != "qrheads", sorted(r["other"].items()),
                             r["head_seed"] or 0, r["beta"], r["top_p"], r["budget"]))
    return rows


def write_budget_curves(rows: Sequence[Mapping], stem: str | Path, *, notes: Sequence[str] = (),
                        meta: Mapping[str, Any] | None = None) -> tuple[Path, Path]:
    """<stem>.md (one table per model and task) and <stem>.json.xz (the rows) of `budget_curves`."""
    with_table_q(rows, key="gains")
    parts = ["# Selection budget (dev split, teacher forced): gain over vanilla", "",
             "Paired difference to vanilla on the same instances, 95% percentile-bootstrap CI. "
             "K: the cap on boosted keys; K/n: the cap as a share of the prompt; "
             "boosted: keys actually boosted per step (mean)."]
    for model, task in dict.fromkeys((r["model"], r["task"]) for r in rows):
        body = [[r["length"], "QRHeads" if r["heads"] == "qrheads" else f"random (seed {r['head_seed']})",
                 f"{r['beta']:g}", f"{r['top_p']:g}", f"{'K' if r['budget'][0] == 'K' else 'K/n'}={r['budget'][1]:g}",
                 ", ".join(f"{k}={v}" for k, v in r["other"].items()) or "-", r["n"],
                 "-" if r["mean_selected"] is None else f"{r['mean_selected']:.1f}",
                 fmt_ci(r["vanilla"].get(r["metric"])), fmt_delta(r["gain"])]
                for r in rows if (r["model"], r["task"]) == (model, task)]
        metric = next(r["metric"] for r in rows if (r["model"], r["task"]) == (model, task))
        parts += ["", f"## {model}: {task}", "",
                  table_markdown(["length", "heads", "beta", "p", "budget", "other", "n", "boosted",
                                  f"vanilla {metric}", f"Δ {metric}"], body)]
    if not rows:
        parts += ["", "No DySCO teacher-forced records."]
    # every configuration of the dev sweep in every cell, a megabyte as JSON: committed compressed
    return write_pair(stem, parts, {"table": "budget_curves", **(meta or {}), "rows": list(rows),
                                    "notes": list(notes)}, notes, json_suffix=".json.xz")


def write_pair(stem: str | Path, parts: list[str], document: Mapping, notes: Sequence[str],
               json_suffix: str = ".json") -> tuple[Path, Path]:
    stem = Path(stem)
    if notes:
        parts = parts + ["", "Notes:", ""] + [f"- {n}" for n in notes]
    md = write_text(stem.with_name(stem.name + ".md"), "\n".join(p.removesuffix("\n") for p in parts))
    return md, write_json(stem.with_name(stem.name + json_suffix), document)


# ---------------------------------------------------------------------------- test table


def config_key(method: str, fields: Mapping[str, Any]) -> MethodKey:
    """The MethodKey of a DySCO-family run with these DecodingConfig fields (the rest the paper
    preset's, as the study ran them: the current schedule and template masking); ConfigError for
    an unknown field or value."""
    fields = dict(fields)
    given = fields.pop("method", method)
    if given != method:
        raise ConfigError(f"expected a {method} configuration, got method {given!r}")
    unknown = sorted(set(fields) - set(KEYWORDS))
    if unknown:
        raise ConfigError(f"not DecodingConfig fields: {', '.join(unknown)}")
    flat = {name: value for name, value in fields.items() if name in FLAT_FIELDS}
    shared = {name: value for name, value in fields.items() if name not in FLAT_FIELDS}
    config = preset("paper", method=method, params=param_values(flat), **shared)
    return MethodKey.from_config(config.record_fields())


def _estimate(recs: Sequence[Mapping], ref: Sequence[Mapping], metric: str, paired: bool,
              ci: CIOptions) -> tuple[dict | None, dict | None]:
    mean = metric_estimates(recs, [metric], ci)[metric] if recs else None
    delta = paired_deltas(recs, ref, [metric], ci)[metric] if paired and recs and ref else None
    return mean, delta


def _test_row(model: str, length: int, role: str, name: str, key: MethodKey, tf: ByKey, free: ByKey,
              ci: CIOptions) -> dict:
    sources = {"tf": (tf.get(key, []), tf.get(VANILLA, [])), "free": (free.get(key, []), free.get(VANILLA, []))}
    row: dict[str, Any] = {"model": model, "length": length, "role": role, "name": name, "config": key.label,
                           "config_method": key.method, "params": key.params_dict(),
                           "n_tf": len(sources["tf"][0]), "n_free": len(sources["free"][0]),
                           "mean_selected": mean_selected([*sources["tf"][0], *sources["free"][0]]),
                           "metrics": {}, "delta": {}, "not_run": []}
    for metric, source, _ in TEST_COLUMNS:
        recs, ref = sources[source]
        if not recs:
            row["not_run"].append(metric)
        row["metrics"][metric], row["delta"][metric] = _estimate(recs, ref, metric, role != "vanilla", ci)
    if role == "vanilla":
        del row["delta"]
    return row


def _uniattns_rows(model: str, keys: Iterable[MethodKey], taus: Mapping[str, float] | None,
                   where: str, notes: list[str]) -> list[tuple[str, MethodKey]]:
    """(name, key) of the UniAttnS rows: the chosen tau, else every stored one."""
    stored = sorted(k.value("tau") for k in keys if k.method == "uniattns")
    tau = (taus or {}).get(model)
    if tau is not None:
        key = MethodKey("uniattns", (("tau", float(tau)),))
        return [(key.label, key)]
    if not stored:
        notes.append(f"{where}: no UniAttnS records and no tau chosen for {model}")
        return [("UniAttnS (no tau chosen)", MethodKey("uniattns", (("tau", 1.0),)))]
    if len(stored) > 1:
        notes.append(f"{where}: no tau chosen for {model}; every stored UniAttnS tau is shown "
                     f"({', '.join(f'{t:g}' for t in stored)})")
    keys = [MethodKey("uniattns", (("tau", t),)) for t in stored]
    return [(f"{k.label}, not chosen", k) for k in keys]


def heldout_table(tf_records: Iterable[Mapping], free_records: Iterable[Mapping], chosen: Mapping[str, Any], *,
               taus: Mapping[str, float] | None = None, chosen_by_model: Mapping[str, Mapping[str, Any]] | None = None,
               protocol: Mapping[str, Any] | None = None, lengths: Sequence[int] | None = None,
               task: str = PATH_TRAVERSAL.name, ci: CIOptions = CIOptions()) -> tuple[list[dict], list[str]]:
    """Rows per model and length: vanilla, UniAttnS (tau from `taus[model]`, else what is stored),
    the paper preset, `chosen` (DecodingConfig fields; `chosen_by_model` overrides it per model),
    and random heads and static scaling at the chosen parameters. Each row holds every column's
    mean (`metrics`) and, except vanilla, its paired difference to vanilla (`delta`), both with
    95% CIs; columns without records are listed in `not_run`. `protocol` (schedule, template
    masking, ...) applies to the preset and the chosen runs; default: the current ones.
    `lengths`: keep only these (default: every length present)."""
    tf_records, free_records = list(tf_records), list(free_records)
    if any(not is_teacher_forced(r) for r in tf_records):
        raise ConfigError("tf_records holds free-generation records (no settings.teacher_forced)")
    if any(is_teacher_forced(r) for r in free_records):
        raise ConfigError("free_records holds teacher-forced records")
    tf_cells, tf_dropped = by_cell(r for r in tf_records if r["task"] == task)
    free_cells, free_dropped = by_cell(r for r in free_records if r["task"] == task)
    notes = [f"{n} repeated {kind} records (same method and instance) counted once"
             for kind, n in (("teacher-forced", tf_dropped), ("free-generation", free_dropped)) if n]
    protocol = dict(protocol or {})
    paper = config_key("dysco", {**protocol, **PAPER_PRESET})
    chosen_keys = {m: config_key("dysco", {**protocol, **c}) for m, c in (chosen_by_model or {}).items()}
    default_chosen = config_key("dysco", {**protocol, **chosen})
    cells = sorted(c for c in {*tf_cells, *free_cells} if lengths is None or c[2] in lengths)
    rows: list[dict] = []
    for model, _, length in cells:
        tf, free = tf_cells.get((model, task, length), {}), free_cells.get((model, task, length), {})
        keys, where = {*tf, *free}, f"{model} {length}"
        best = chosen_keys.get(model, default_chosen)
        random = sorted(k for k in keys if k.method == "dysco-random" and k.scaling_params() == best.params)
        specs = [("vanilla", "vanilla", VANILLA)]
        specs += [("uniattns", name, k) for name, k in _uniattns_rows(model, keys, taus, where, notes)]
        specs += [("paper", "DySCO paper preset", paper), ("chosen", "DySCO chosen", best)]
        specs += [("random", "random heads at chosen", k) for k in random
                  or [MethodKey("dysco-random", (*best.params, ("head_seed", 0)))]]
        specs.append(("static", "static scaling at chosen", MethodKey("dysco-static", best.params)))
        rows += [_test_row(model, length, role, name, key, tf, free, ci) for role, name, key in specs]
        if best == paper:
            notes.append(f"{where}: the chosen configuration is the paper preset")
        if not tf.get(VANILLA) or not free.get(VANILLA):
            notes.append(f"{where}: no {'teacher-forced' if not tf.get(VANILLA) else 'free-generation'} vanilla "
                         "records; those differences to vanilla are empty")
        shown = {key for _, _, key in specs}
        left = sorted(k.label for k in keys if k not in shown)
        if left:
            notes.append(f"{where}: also stored, not in this table: {'; '.join(left)}")
    return rows, notes




def format_cell(row: Mapping, metric: str, digits: int = 3) -> str:
    """'0.600' for vanilla; '0.700 (Δ +0.100 [+0.050, +0.150])' otherwise; 'not run' without records."""
    if metric in row["not_run"]:
        return NOT_RUN
    mean = row["metrics"][metric]
    if mean is None:
        return "no value"
    text = f"{mean['mean']:.{digits}f}"
    if "delta" not in row:
        return text
    delta = row["delta"][metric]
    return f"{text} (Δ {fmt_delta(delta, digits) if delta else 'no paired vanilla'})"


def write_heldout_table(rows: Sequence[Mapping], stem: str | Path, *, notes: Sequence[str] = (),
                     meta: Mapping[str, Any] | None = None,
                     ci: CIOptions = CIOptions()) -> tuple[Path, Path]:
    """<stem>.md (one table per model) and <stem>.json (`meta`, the columns, rows and notes)."""
    with_table_q(rows)
    parts = ["# Path Traversal, test split: vanilla, UniAttnS, DySCO preset and chosen, ablations", "",
             f"Means over instances; Δ: paired difference to vanilla on the same instances, {ci.description}. "
             f"{DELTA_LEGEND} TF: teacher forced (gold route given); exact / partial / step accuracy: free generation. "
             "n: instances teacher forced / generated; boosted: keys boosted per step (mean)."]
    for model in dict.fromkeys(r["model"] for r in rows):
        body = [[r["length"], r["name"], r["config"], f"{r['n_tf']}/{r['n_free']}",
                 "-" if r["mean_selected"] is None else f"{r['mean_selected']:.1f}",
                 *(format_cell(r, metric) for metric, _, _ in TEST_COLUMNS)] for r in rows if r["model"] == model]
        parts += ["", f"## {model}", "",
                  table_markdown(["length", "row", "config", "n", "boosted", *(t for _, _, t in TEST_COLUMNS)], body)]
    if not rows:
        parts += ["", "No Path Traversal records."]
    document = {"table": "budget_test", **(meta or {}), "ci": ci.description,
                "columns": [{"metric": m, "records": s, "title": t} for m, s, t in TEST_COLUMNS],
                "rows": list(rows), "notes": list(notes)}
    return write_pair(stem, parts, document, notes)


# ---------------------------------------------------------------------------- dev free generation

def free_metrics(task: str) -> tuple[str, ...]:
    """A task's free-generation metrics: the paper's table columns, else the choice rule's primary one."""
    spec = TASKS.get(task)
    return () if spec is None else spec.metrics.table_fields or (spec.metrics.primary,)


def choice_keys(choice: Mapping[str, Any]) -> tuple[MethodKey | None, dict[MethodKey, float]]:
    """The chosen configuration's MethodKey and every ranked one's mean rank, from a
    chosen_<model>.json document (`budget_choice.choose_config`)."""
    chosen = config_key("dysco", choice["config"]) if choice.get("config") else None
    ranks = {config_key("dysco", r["config"]): float(r["mean_rank"]) for r in choice.get("ranking") or ()}
    return chosen, ranks


def dev_free_table(free_records: Iterable[Mapping], choices: Mapping[str, Mapping[str, Any]] | None = None,
                   ci: CIOptions = CIOptions()) -> tuple[list[dict], list[str]]:
    """Rows per (model, task, length) of the free-generation dev records: vanilla, the paper preset,
    then every other configuration run there (the teacher-forced shortlist), best teacher-forced
    rank first. Each row holds the task's free metrics (`free_metrics`): `metrics` (means) and,
    except vanilla, `delta` (paired difference to vanilla), both with 95% CIs; `not_run` lists the
    metrics without records. `choices` (chosen_<model>.json documents by model) marks the chosen
    configuration (role "chosen", else "shortlisted") and gives `tf_rank`, its dev mean rank."""
    records = list(free_records)
    if any(is_teacher_forced(r) for r in records):
        raise ConfigError("dev_free_table takes free-generation records; teacher-forced ones were given")
    cells, dropped = by_cell(records)
    notes = [f"{dropped} repeated free-generation records (same method and instance) counted once"] if dropped else []
    paper = config_key("dysco", PAPER_PRESET)
    rows: list[dict] = []
    for (model, task, length), by_key in cells.items():
        chosen, ranks = choice_keys((choices or {}).get(model) or {})
        metrics = free_metrics(task)
        where = f"{model} {task} {length}"
        if not metrics:
            notes.append(f"{where}: no free-generation metrics known for task {task!r}; only counts shown")
        vanilla = by_key.get(VANILLA, [])
        if not vanilla:
            notes.append(f"{where}: no vanilla records; the differences to vanilla are empty")
        others = sorted((k for k in by_key if k not in (VANILLA, paper)),
                        key=lambda k: (ranks.get(k, float("inf")), k))
        specs = [("vanilla", "vanilla", VANILLA), ("paper", "DySCO paper preset", paper)]
        specs += [("chosen", "DySCO chosen", k) if k == chosen else ("shortlisted", "DySCO shortlisted", k)
                  for k in others]
        if chosen == paper:
            notes.append(f"{where}: the chosen configuration is the paper preset")
        elif chosen is not None and chosen not in by_key:
            notes.append(f"{where}: the chosen configuration ({chosen.label}) was not run freely here")
        for role, name, key in specs:
            recs = by_key.get(key, [])
            row: dict[str, Any] = {"model": model, "task": task, "length": length, "role": role, "name": name,
                                   "config": key.label, "config_method": key.method, "params": key.params_dict(),
                                   "n": len(recs), "mean_selected": mean_selected(recs), "tf_rank": ranks.get(key),
                                   "metrics": {}, "delta": {}, "not_run": [m for m in metrics if not recs]}
            for metric in metrics:
                row["metrics"][metric], row["delta"][metric] = _estimate(recs, vanilla, metric, role != "vanilla",
                                                                         ci)
            if role == "vanilla":
                del row["delta"]
            rows.append(row)
    return rows, notes


def write_dev_free(rows: Sequence[Mapping], stem: str | Path, *, notes: Sequence[str] = (),
                   meta: Mapping[str, Any] | None = None, ci: CIOptions = CIOptions()) -> tuple[Path, Path]:
    """<stem>.md (one table per model and task) and <stem>.json (`meta`, rows, notes) of `dev_free_table`."""
    parts = ["# Selection budget (dev split, free generation): vanilla, the paper preset, the shortlist", "",
             f"Means over instances; Δ: paired difference to vanilla on the same instances, {ci.description}. "
             f"{DELTA_LEGEND} The shortlist is the best-ranked configurations of the teacher-forced sweep; "
             "TF rank: their mean rank there (the choice rule). Free generation is reported beside the choice, "
             "not used for it. boosted: keys boosted per step (mean)."]
    for model, task in dict.fromkeys((r["model"], r["task"]) for r in rows):
        cell = [r for r in rows if (r["model"], r["task"]) == (model, task)]
        metrics = list(cell[0]["metrics"])
        body = [[r["length"], r["name"], r["config"], r["n"],
                 "-" if r["mean_selected"] is None else f"{r['mean_selected']:.1f}",
                 "-" if r["tf_rank"] is None else f"{r['tf_rank']:.2f}", *(format_cell(r, m) for m in metrics)]
                for r in cell]
        parts += ["", f"## {model}: {task}", "",
                  table_markdown(["length", "row", "config", "n", "boosted", "TF rank", *metrics], body)]
    if not rows:
        parts += ["", "No free-generation dev records."]
    return write_pair(stem, parts, {"table": "budget_dev_free", **(meta or {}), "ci": ci.description,
                                    "rows": list(rows), "notes": list(notes)}, notes)


# ---------------------------------------------------------------------------- every output


def read_split(folder: Path, root: Path, note: Callable[[str], None]) -> tuple[list[dict], list[str]]:
    """The records of every store in `folder` and the stores' paths relative to `root`; a missing
    folder or an unreadable store is a note, not an error. ConfigError when the stores do not pool
    (`stores.check_comparable`; teacher-forced and free records are compared apart)."""
    files = stores_in(folder) if folder.is_dir() else []  # a store and its archive count once
    if not files:
        note(f"no stores (*.jsonl, *.jsonl.xz) in {folder}")
    items: list[Sourced] = []
    for path in files:
        try:
            items += read_sourced(path)
        except (ConfigError, OSError, ValueError) as e:
            note(f"{path} left out: {e}")
    check_comparable(items, apart=("teacher_forced",))  # repeats are the tables' to count (`by_cell`)
    return [it.record for it in items], [display_path(p, root) for p in files]


def read_choices(budget_dir: Path, note: Callable[[str], None]) -> dict[str, dict]:
    """chosen_<model>.json documents by model (the document's own `model`, else the file name's)."""
    choices = {}
    for path in sorted(budget_dir.glob("chosen_*.json")):
        try:
            choice = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(choice, dict) or not isinstance(choice.get("config"), dict):
                raise ValueError("no 'config' object")
        except (OSError, ValueError) as e:
            note(f"{path} left out: {e}")
            continue
        model = str(choice.get("model") or path.stem.removeprefix("chosen_"))
        choices[model] = {**choice, "source": path.name}
    return choices


def write_reports(budget_dir: Path, *, ci: CIOptions = CIOptions()) -> list[str]:
    """Every table and figure of the budget study from the stores under `budget_dir` (dev/*.jsonl,
    test/*.jsonl) and its chosen_<model>.json files, written into `budget_dir`:

    - curves.md/.json.xz and effect.png/.html (+ effect-fraction.*): the teacher-forced dev sweep;
    - dev_free.md/.json: free generation on the dev split, paired against vanilla;
    - test_table.md/.json: the test split, with UniAttnS at the tau its MRCR sweep chose on the
      paper's grid (`budget_study.chosen_tau`, read from `<budget_dir>/../mrcr/`).

    A model with stores but no chosen_<model>.json gets the rule applied to its dev stores again
    (said in a note). Returns "wrote PATH" and "note: ..." lines; missing or unusable inputs
    leave that output out with a note, never raise."""
    budget_dir = Path(budget_dir)
    lines: list[str] = []

    def note(text: str) -> None:
        lines.append(f"note: {text}")

    def wrote(paths: Iterable[Path]) -> None:
        lines.extend(f"wrote {p}" for p in paths)

    dev, dev_stores = read_split(budget_dir / "dev", budget_dir, note)
    test, test_stores = read_split(budget_dir / "test", budget_dir, note)
    dev_tf = [r for r in dev if is_teacher_forced(r)]
    dev_free = [r for r in dev if not is_teacher_forced(r)]
    choices = read_choices(budget_dir, note)
    for model in sorted({str(r["model"]) for r in dev + test} - set(choices)):
        try:
            choice = choose_config([r for r in dev_tf if r["model"] == model],
                                   [r for r in dev_free if r["model"] == model])
        except ConfigError as e:
            note(f"{model}: no chosen_{model}.json and no choice from the dev stores ({e})")
            continue
        choices[model] = {**choice, "model": model, "source": "the dev stores (no chosen file)"}
        note(f"{model}: no chosen_{model}.json; the rule applied to the dev stores chooses {choice['config']}")
    chosen = {m: {"config": c["config"], "source": c["source"]} for m, c in sorted(choices.items())}

    def attempt(what: str, make: Callable[[], Iterable[Path]]) -> None:
        try:
            wrote(make())
        except ConfigError as e:
            note(f"{what} not written: {e}")
        except ImportError as e:  # a machine without the plotting libraries still gets the tables
            note(f"{what} not written: {e.name or e} is not installed")

    try:
        curves = budget_curves(dev, ci=ci)
    except ConfigError as e:
        note(f"curves and effect figure not written: {e}")
        curves = None
    if curves:
        attempt("curves", lambda: write_budget_curves(curves, budget_dir / "curves", meta={
            "split": "dev", "stores": dev_stores, "chosen": chosen, "ci": ci.description}))
        attempt("effect figure", lambda: [p for pair in budget_figure(curves, budget_dir / "effect").values()
                                          for p in pair])
    elif curves is not None:
        note("no DySCO teacher-forced dev records: curves and effect figure not written")

    if dev_free:
        def free() -> tuple[Path, Path]:
            rows, notes = dev_free_table(dev_free, choices, ci)
            return write_dev_free(rows, budget_dir / "dev_free", notes=notes, ci=ci,
                                  meta={"split": "dev", "stores": dev_stores, "chosen": chosen})
        attempt("dev_free table", free)
    else:
        note("no free-generation dev records: dev_free table not written")

    test_tf = [r for r in test if is_teacher_forced(r) and r["model"] in choices]
    test_free = [r for r in test if not is_teacher_forced(r) and r["model"] in choices]
    left = sorted({str(r["model"]) for r in test} - set(choices))
    if left:
        note(f"test table leaves out {', '.join(left)}: no chosen configuration")
    if test_tf or test_free:
        models = {str(r["model"]) for r in test_tf + test_free}
        taus = {m: t for m in sorted(models) if (t := chosen_tau(budget_dir.parent, m)) is not None}

        def table() -> tuple[Path, Path]:
            rows, notes = heldout_table(test_tf, test_free, {}, taus=taus, ci=ci,
                                     chosen_by_model={m: c["config"] for m, c in choices.items()})
            return write_heldout_table(rows, budget_dir / "test_table", notes=notes, ci=ci,
                                    meta={"split": "test", "stores": test_stores, "chosen": chosen, "taus": taus})
        attempt("test table", table)
    else:
        note("no test records with a chosen configuration: test table not written")
    return lines
