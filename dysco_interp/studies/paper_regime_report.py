"""The paper-regime study's tables and figures, from its stores (no model; `paper_regime` runs them).

Under `<folder>` (figures/paper_regime):
- `test_tf.{md,json}` and `effect.{png,html}`: Path Traversal teacher forced, every method against
  vanilla per length, and the paired effect against length for each preset;
- `yarn_cost.{md,json}`: vanilla under YaRN against vanilla natively, where the window holds both;
- `free.{md,json}`: Path Traversal decoded freely at 1K-31K (200 instances per length);
- `format_forced.{md,json}`: the same instances with each answer's format forced and its cities
  decoded (`evaluate --format-forced`);
- `tasks.{md,json}`: Needle QA and MRCR-style against vanilla;
- `dev_choice.md`: the dev split's ranking, its choice and each length's winner;
- `gold_rank.{png,html}`: how often the QRHeads, all heads and random heads put the gold edge in
  their top 5%, and the QRHeads' rank of it, at every step and length (from the motivation store);
- beside it, `<folder>/../motivation_128k/`: the QRHeads' rank and mass of the gold edge at every
  step and length (the motivation figure to 128K, drawn by `motivation_summary`; one level under
  figures/, so its page shares figures/plotly.min.js).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dysco_interp.analysis.method_key import MethodKey
from dysco_interp.analysis.records import read_records
from dysco_interp.analysis.report import DELTA_LEGEND, fmt_ci, fmt_delta, write_json, write_text
from dysco_interp.analysis.result_tables import (
    VANILLA,
    CIOptions,
    by_cell,
    method_rows,
    metric_estimates,
    paired_deltas,
    with_table_q,
)
from dysco_interp.decoding.config import PRESETS
from dysco_interp.decoding.methods import param_name
from dysco_interp.errors import ConfigError
from dysco_interp.heads.detected_on import shared_with
from dysco_interp.heads.shipped import available_shipped_heads, shipped_heads
from dysco_interp.stores.archives import glob_stores
from dysco_interp.studies.budget_choice import selection_fields
from dysco_interp.studies.motivation_summary import STORE_NAME, draw
from dysco_interp.tasks.base import instance_origin
from dysco_interp.tasks.lengths import length_label
from dysco_interp.tasks.registry import TASKS
from dysco_interp.viz.figures import save_ci_lines
from dysco_interp.viz.panels import Panel, Series
from dysco_interp.viz.tables import table_markdown

COMMAND = "python analyses/paper_regime.py --figures-only"
MOTIVATION = "motivation_128k"  # the motivation study's store and figure at 16K-127K, beside the folder
NATIVE_CONTEXT = 32768  # Qwen2.5-Coder's window: lengths past it ran with YaRN factor 4


def method_name(key: MethodKey, chosen: Mapping | None = None) -> str:
    """A method as the tables name it: its preset where its selection is one (the dev choice
    marked), else its label."""
    if key.method not in ("dysco", "dysco-random", "dysco-static"):
        return key.label
    fields = selection_fields(key)
    names = [n for n, c in PRESETS.items() if all(c.parameter(param_name(f)) == v for f, v in fields.items())]
    if chosen is not None and fields == dict(chosen):
        names.append("dev rule")
    if not names:
        return key.label
    kind = {"dysco": "", "dysco-random": "random heads, ", "dysco-static": "static, "}[key.method]
    return f"{kind}{' = '.join(names)}"


def tick(length: int) -> str:
    return length_label(length).upper() + (" YaRN" if length > NATIVE_CONTEXT else "")


def records_of(folder: Path, pattern: str) -> list[dict]:
    return [r for p in glob_stores(folder / pattern) for r in read_records(p)]


def not_held_out(records: Sequence[Mapping]) -> list[str]:
    """A line per model and length whose test instances share the task, seed and index of those
    the model's shipped QRHeads were detected on."""
    ids: dict[tuple[str, int], set[str]] = {}
    for r in records:
        ids.setdefault((str(r["model"]), int(r.get("length") or 0)), set()).add(str(r.get("id")))
    lines = []
    for (model, length), cell in sorted(ids.items()):
        if model not in available_shipped_heads():
            continue
        origins = [o for o in map(instance_origin, sorted(cell)) if o is not None]
        for detected, n in shared_with(shipped_heads(model).detected_on, origins):
            lines.append(f"- {model}, {tick(length)}: {n} of {len(cell)} instances are {detected.describe()}")
    return lines


def table(rows: Sequence[Mapping], metrics: Sequence[str], with_task: bool = False) -> str:
    head = (["task"] if with_task else []) + ["tokens", "method", "n", *metrics, *(f"Δ {m}" for m in metrics)]
    body = [([r["task"]] if with_task else []) + [tick(r["length"]), r["method"], r["n"],
                                                  *(fmt_ci(r["metrics"][m]) for m in metrics),
                                                  *(fmt_delta((r["delta"] or {}).get(m)) for m in metrics)]
            for r in rows]
    return table_markdown(head, body)


def effect_panels(rows: Sequence[Mapping], metrics: Mapping[str, str], lengths: Sequence[int]) -> list[Panel]:
    """One panel per metric: each method's paired difference to vanilla against length."""
    panels = []
    for metric, title in metrics.items():
        series = []
        for name in dict.fromkeys(r["method"] for r in rows if r["delta"] is not None):
            by_length = {r["length"]: r["delta"][metric] for r in rows if r["method"] == name and r["delta"]}
            points = [by_length.get(n) for n in lengths]
            series.append(Series(name, [p["mean"] if p else None for p in points],
                                 [p["lo"] if p else None for p in points], [p["hi"] if p else None for p in points]))
        panels.append(Panel(title, f"Δ {title} vs vanilla", series))
    return panels


def rank_panels(rows: Sequence[Mapping]) -> list[Panel]:
    """From the motivation summary's rows: how often each head set puts the gold edge in its top
    5% of edges, and where the QRHeads rank it, over every step."""
    def series(name: str, metric: str) -> Series:
        values = [r["all_steps"][metric] for r in rows]
        return Series(name, [v["mean"] for v in values], [v["lo"] for v in values], [v["hi"] for v in values])

    return [Panel("gold edge in the top 5% of edges", "share of steps",
                  [series("QRHeads", "top_qrheads"), series("all heads", "top_all_heads"),
                   series("random heads", "top_random")]),
            Panel("the QRHeads' rank of the gold edge", "mean rank (1 = most attended)",
                  [series("QRHeads", "rank_qrheads")])]


def model_tables(rows: Sequence[dict], metrics: Sequence[str], with_task: bool = False, level: str = "##") -> str:
    """The rows' table, one per model under its name when they hold several."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    if len(models) == 1:
        return table(list(rows), metrics, with_task)
    return "\n\n".join(f"{level} {m}\n\n" + table([r for r in rows if r["model"] == m], metrics, with_task)
                       for m in models)


def section(folder: Path, name: str, title: str, rows: list[dict], metrics: Sequence[str], ci: CIOptions,
            notes: Sequence[str] = (), with_task: bool = False) -> Path:
    with_table_q(rows)
    text = "\n".join([f"# {title}", "", f"Mean over instances; {ci.description}. Δ: paired difference to "
                      "vanilla on the same instances. YaRN: the model stretched by factor 4 past its "
                      f"32,768-token window. {DELTA_LEGEND}", "", *notes, model_tables(rows, metrics, with_task), "",
                      f"`{COMMAND}`", ""])
    write_json(folder / f"{name}.json", {"table": title, "command": COMMAND, "ci": ci.description, "rows": rows})
    return write_text(folder / f"{name}.md", text)


def dev_choice_text(choice: Mapping, model: str | None = None) -> str:
    """The choice in words and tables; `model` names it in the title (a study of several models)."""
    named = "" if model is None else f" ({model})"
    lines = [f"# The dev split's choice: one rule from 2K to 128K{named}", "", f"Rule: {choice['rule']}.", "",
             f"Cells: {', '.join(choice['cells'])}.", "",
             f"Chosen: {choice['config']} (of {choice['n_candidates']} candidates run in every cell); "
             f"UniAttnS tau {choice['tau']} (MRCR-style dev).", "", "## Mean rank over every cell (top 10)", ""]
    cells = choice["cells"]
    lines.append(table_markdown(["configuration", "mean rank", *cells],
                                [[r["label"], f"{r['mean_rank']:.2f}", *(f"{r['gains'].get(c, float('nan')):+.4f}"
                                                                         for c in cells)]
                                 for r in choice["ranking"]]))
    lines += ["", "Gains: Path Traversal step accuracy, MRCR-style gold log-probability per token, paired "
              "to vanilla on the dev instances.", "", "## Each length's winner (among everything run there)", ""]
    lines.append(table_markdown(["tokens", "winner", "mean rank", "candidates", "gains"],
                                [[tick(int(k)), v["label"], f"{v['mean_rank']:.2f}", v["n_candidates"],
                                  "; ".join(f"{c.split('/')[1]} {g:+.4f}" for c, g in v["gains"].items())]
                                 for k, v in choice["by_length"].items()]))
    return "\n".join(lines + ["", f"`{COMMAND}`", ""])


def write_reports(folder: Path, ci: CIOptions = CIOptions()) -> list[str]:
    """Every table and figure of the study that its stores support; returns what was written."""
    folder = Path(folder)
    choices = sorted(folder.glob("chosen_*.json"))
    if not choices:
        raise ConfigError(f"no chosen_<model>.json under {folder}: run the study's choose part first")
    chosen_by_model = {c["model"]: c for c in (json.loads(p.read_text()) for p in choices)}
    written: list[Any] = [write_text(folder / "dev_choice.md", "\n".join(
        dev_choice_text(c, model if len(chosen_by_model) > 1 else None) for model, c in chosen_by_model.items()))]

    def stem(base: str, model: str) -> Path:
        # one figure per model, named for it once the study holds several
        return folder / (base if len(chosen_by_model) == 1 else f"{base}_{model}")

    def rows_of(cells: Mapping, metrics: Sequence[str]) -> list[dict]:
        """Each model's rows, its methods named by its own dev choice."""
        out: list[dict] = []
        for model, chosen in chosen_by_model.items():
            mine = {key: by_key for key, by_key in cells.items() if key[0] == model}
            out += method_rows(mine, metrics, ci, lambda key, config=chosen["config"]: method_name(key, config))
        return out

    test = folder / "test"
    forced = TASKS["path_traversal"].metrics.forced[:2]
    cells, _ = by_cell(records_of(test, "*_path_traversal_*_tf.jsonl"))
    rows = rows_of(cells, forced)
    if rows:
        written.append(section(folder, "test_tf", "Path Traversal, teacher forced, test split", rows, forced, ci))
    for model in chosen_by_model:
        mine = [r for r in rows if r["model"] == model]
        if not mine:
            continue
        lengths = sorted({r["length"] for r in mine})
        written += save_ci_lines(effect_panels(mine, {"tf_step_accuracy": "step accuracy",
                                                      "tf_city_logprob": "gold city log p"}, lengths),
                                 [tick(n) for n in lengths], stem("effect", model),
                                 title=f"{model}: Path Traversal, teacher forced, paired effect against "
                                       "vanilla (95% bootstrap CI)", xlabel="prompt length (tokens)")
    yarn_rows = []
    for (model, task, length), by_key in by_cell(records_of(test, "*_path_traversal_*_tf_yarn*.jsonl"))[0].items():
        reference = cells.get((model, task, length), {}).get(VANILLA)
        if VANILLA in by_key and reference:
            base = {"model": model, "task": task, "length": length}
            yarn_rows += [{**base, "method": "vanilla, native", "n": len(reference),
                           "metrics": metric_estimates(reference, forced, ci), "delta": None},
                          {**base, "method": "vanilla, YaRN 4", "n": len(by_key[VANILLA]),
                           "metrics": metric_estimates(by_key[VANILLA], forced, ci),
                           "delta": paired_deltas(by_key[VANILLA], reference, forced, ci)}]
    if yarn_rows:
        written.append(section(folder, "yarn_cost", "What YaRN costs where the native window holds the prompt",
                               yarn_rows, forced, ci))
    free = TASKS["path_traversal"].metrics.free[:3]
    for kind, name, title in (("free", "free", "Path Traversal decoded freely, test split"),
                              ("ff", "format_forced", "Path Traversal with each answer's format forced and its "
                                                      "cities decoded, test split")):
        rows = rows_of(by_cell(records_of(test, f"*_path_traversal_*_{kind}.jsonl"))[0], free)
        if rows:
            written.append(section(folder, name, title, rows, free, ci))
    task_rows, leaks = [], []
    for task in ("needle_qa", "mrcr"):
        for kind in ("tf", "free"):
            metrics = ("tf_logprob", "tf_token_accuracy") if kind == "tf" else TASKS[task].metrics.free
            records = records_of(test, f"*_{task}_*_{kind}.jsonl")
            leaks += [line for line in not_held_out(records) if line not in leaks]
            rows = rows_of(by_cell(records)[0], metrics)
            task_rows += [{**r, "task": f"{task} ({'teacher forced' if kind == 'tf' else 'free'})",
                           "shown": list(metrics)} for r in rows]
    if task_rows:
        with_table_q(task_rows)
        text = ["# Needle QA and MRCR-style, test split", "",
                f"Mean over instances; {ci.description}. Δ: paired difference to vanilla on the same instances. "
                f"{DELTA_LEGEND}", ""]
        if leaks:
            text += ["Not held out (the instances are among those the model's shipped QRHeads were detected on; "
                     "read these cells as in-sample):", "", *leaks, ""]
        for task in dict.fromkeys(r["task"] for r in task_rows):
            mine = [r for r in task_rows if r["task"] == task]
            text += [f"## {task}", "", model_tables(mine, mine[0]["shown"], level="###"), ""]
        write_json(folder / "tasks.json", {"table": "tasks", "command": COMMAND, "ci": ci.description,
                                           "rows": task_rows})
        written.append(write_text(folder / "tasks.md", "\n".join(text + [f"`{COMMAND}`", ""])))
    motivation = folder.parent / MOTIVATION
    if glob_stores(motivation / STORE_NAME):
        written += draw(motivation, Path(glob_stores(motivation / STORE_NAME)[0]), None, 2, ci.n_boot,
                        f"python analyses/motivation.py --figures-only --out-dir figures/{MOTIVATION}")
        for model in chosen_by_model:
            summary_path = motivation / f"{model}_summary.json"
            if not summary_path.is_file():  # no read-outs of this model at these lengths
                continue
            rows = json.loads(summary_path.read_text())["rows"]
            written += save_ci_lines(rank_panels(rows), [tick(r["length"]) for r in rows], stem("gold_rank", model),
                                     title=f"{model}: the gold edge in the heads' attention, every step of 30 "
                                           "test instances (mean, 95% bootstrap CI)", xlabel="prompt length (tokens)")
    return [str(w) for w in written]
