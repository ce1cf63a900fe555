"""Summaries of evaluation records for the paper's tables (pure: records in, rows out).

Records are grouped by cell (model, task, length, setting) and by what ran (`MethodKey`
from the record's config). Every mean carries a 95% percentile-bootstrap interval over
instances; comparisons against a reference method are paired by instance (seed, index, id) and
carry the instances that got better and worse, an exact sign-flip p, and (`with_table_q`) the
Benjamini-Hochberg q over the table they are in.
A row's n counts its records; a metric that is null on some of them (not measured there) is
averaged over the others, and its estimate says so (its own n, and how many were `null`). The
readers (`stores.check_record`) refuse every other value that is no score: NaN, a boolean, text,
a share outside [0, 1].

- `tau_sweep` / `choose_tau`: UniAttnS's temperature chosen on MRCR-style data, as the
  paper does: the best mean score; ties go to the tau closest to 1 (the smaller on a tie).
- `pt_table`: vanilla / UniAttnS at the chosen tau / DySCO per model and length.
- `ablation_table`: DySCO vs random heads vs static selection at equal DySCO parameters.
- `robustness_points`: DySCO with one of p, K, beta moved off the default.
- `by_cell`: records per (model, task, length) and `MethodKey`, each instance once, for summaries
  that pair methods within a cell whatever its setting (the selection-budget study's).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dysco_interp.analysis.bootstrap import bootstrap_ci
from dysco_interp.analysis.margins import margin_of
from dysco_interp.analysis.method_key import (
    ROBUSTNESS_PARAMS,
    MethodKey,
    default_value,
    method_key,
    setting_of,
)
from dysco_interp.analysis.multiplicity import fill_q
from dysco_interp.analysis.paired import paired_comparison
from dysco_interp.decoding.format_forced import FORMAT_FORCED
from dysco_interp.errors import ConfigError
from dysco_interp.tasks.mrcr.spec import MRCR
from dysco_interp.tasks.path_traversal.spec import PATH_TRAVERSAL
from dysco_interp.tasks.registry import TASKS

TAU_TIE_TOLERANCE = 1e-9


def table_metrics(task: str) -> tuple[str, ...]:
    """The metrics the tables report for a task (its spec's `metrics.tables`; none for an unknown task)."""
    spec = TASKS.get(task)
    return spec.metrics.table_fields if spec else ()


def delta_metrics(task: str) -> tuple[str, ...]:
    """The metrics a comparison against a reference method reports for a task."""
    spec = TASKS.get(task)
    return spec.metrics.compared if spec else ()


@dataclass(frozen=True, order=True)
class Cell:
    model: str
    task: str
    length: int
    setting: tuple

    def as_dict(self) -> dict:
        return {"model": self.model, "task": self.task, "length": self.length, "setting": dict(self.setting)}


@dataclass(frozen=True)
class CIOptions:
    n_boot: int = 2000
    seed: int = 0

    @property
    def description(self) -> str:
        return f"95% percentile-bootstrap CI over instances ({self.n_boot} resamples, seed {self.seed})"


def cell_of(record: Mapping) -> Cell:
    return Cell(str(record["model"]), str(record["task"]), int(record.get("length") or 0), setting_of(record))


def instance_of(record: Mapping) -> tuple:
    # current stores name an instance by its content; format-1 records only by seed, index and id
    if "instance" in record:
        return ("instance", record["instance"])
    return generated_instance(record)


def generated_instance(record: Mapping) -> tuple:
    """The instance as make-data names it (index, and the id that spells task, seed, index and
    length): what a format-1 record shares with a current one made from the same data."""
    return (record.get("index"), record.get("id"))


def decoding_mode(record: Mapping) -> str:
    """How the record was decoded: "free", "teacher-forced" or "format-forced"."""
    if record.get("decoding") == FORMAT_FORCED:
        return FORMAT_FORCED
    return "teacher-forced" if (record.get("settings") or {}).get("teacher_forced") else "free"


class OneMode:
    """Refuses records of one method in one cell decoded in two modes: free and format-forced
    records share their score fields, so pooled they would be averaged, or one dropped as a repeat."""

    def __init__(self) -> None:
        self.seen: dict[tuple, str] = {}

    def check(self, where: Any, key: MethodKey, record: Mapping) -> None:
        mode = decoding_mode(record)
        first = self.seen.setdefault((where, key), mode)
        if first != mode:
            raise ConfigError(f"{key.label} ({record.get('model')}, {record.get('task')}, {record.get('length')} "
                              f"tokens) has {first} and {mode} records: table the two modes' stores apart")


def group(records: Iterable[Mapping]) -> dict[Cell, dict[MethodKey, list[Mapping]]]:
    out: dict[Cell, dict[MethodKey, list[Mapping]]] = defaultdict(lambda: defaultdict(list))
    modes = OneMode()
    for r in records:
        cell, key = cell_of(r), method_key(r)
        modes.check(cell, key, r)
        out[cell][key].append(r)
    return {c: dict(m) for c, m in sorted(out.items())}


VANILLA = MethodKey("vanilla")
# the paper preset's selection (`decoding.config.PRESETS["paper"]`): beta, p, K and no share of the prompt
PAPER_PRESET: dict[str, Any] = {"beta": 2.0, "top_p": 0.975, "top_k": 4096, "top_k_fraction": None}

CellKey = tuple[str, str, int]  # (model, task, length): where records pair by instance
ByKey = dict[MethodKey, list[Mapping]]


def by_cell(records: Iterable[Mapping]) -> tuple[dict[CellKey, ByKey], int]:
    """Records per (model, task, length) and MethodKey, a repeated instance counted once (the
    first kept: a run stored twice must not weigh double); and how many repeats were dropped."""
    out: dict[CellKey, ByKey] = defaultdict(lambda: defaultdict(list))
    seen: set[tuple] = set()
    modes = OneMode()
    dropped = 0
    for r in records:
        cell = (str(r["model"]), str(r["task"]), int(r.get("length") or 0))
        key = method_key(r)
        modes.check(cell, key, r)
        if (cell, key, instance_of(r)) in seen:
            dropped += 1
            continue
        seen.add((cell, key, instance_of(r)))
        out[cell][key].append(r)
    return {c: dict(k) for c, k in sorted(out.items())}, dropped


def metric_estimates(records: Sequence[Mapping], metrics: Sequence[str], ci: CIOptions = CIOptions()) -> dict:
    """{metric: {mean, lo, hi, n}} over the records that have the metric (None if none do); n is the
    number of values the mean used, and `null` (only when some are) the records left out, whose
    metric is null or absent (not measured on them)."""
    out: dict[str, dict | None] = {}
    for m in metrics:
        values = [float(r[m]) for r in records if r.get(m) is not None]
        if not values:
            out[m] = None
            continue
        est = bootstrap_ci(values, n_boot=ci.n_boot, seed=ci.seed).as_dict()
        out[m] = est if len(values) == len(records) else {**est, "null": len(records) - len(values)}
    return out


def paired_deltas(records: Sequence[Mapping], reference: Sequence[Mapping], metrics: Sequence[str],
                  ci: CIOptions = CIOptions()) -> dict:
    """{metric: the paired difference record - reference over instances present in both}: its
    mean and bootstrap interval, the instances better, worse and the same, the exact sign-flip p
    and, where the metric has a margin (`analysis.margins`), the TOST p of equivalence within it
    (`analysis.paired`); `with_table_q` adds the BH q once a table's comparisons are all made."""
    # by content where both sides name it, else by what format-1 records keep
    key = instance_of if all("instance" in r for r in (*records, *reference)) else generated_instance
    ref = {key(r): r for r in reference}
    pairs = [(r, ref[key(r)]) for r in records if key(r) in ref]
    out = {}
    for m in metrics:
        diffs = [float(a[m]) - float(b[m]) for a, b in pairs if a.get(m) is not None and b.get(m) is not None]
        out[m] = paired_comparison(diffs, n_boot=ci.n_boot, seed=ci.seed, margin=margin_of(m)).as_dict() \
            if diffs else None
    return out


def with_table_q(rows: Iterable[Mapping], key: str = "delta") -> None:
    """Fill the BH q of every paired difference in one table's rows (each row's `key`: metric ->
    difference), in place: the table is the family a reader scans for starred cells."""
    fill_q(d for row in rows for d in (row.get(key) or {}).values())


def method_rows(cells: Mapping[CellKey, ByKey], metrics: Sequence[str], ci: CIOptions = CIOptions(),
                label: Any = None) -> list[dict]:
    """Every method of every cell (from `by_cell`), vanilla first: its means over instances and its
    paired difference to vanilla on the same instances (None for vanilla, or with no vanilla).
    `label(key)` names a method (default: `key.label`)."""
    rows: list[dict[str, Any]] = []
    for (model, task, length), by_key in cells.items():
        reference = by_key.get(VANILLA)
        for key, records in sorted(by_key.items(), key=lambda kv: (kv[0] != VANILLA, kv[0].label)):
            rows.append({"model": model, "task": task, "length": length,
                         "method": label(key) if label else key.label, "n": len(records),
                         "params": key.params_dict(), "metrics": metric_estimates(records, metrics, ci),
                         "delta": None if reference is None or key == VANILLA
                         else paired_deltas(records, reference, metrics, ci)})
    return rows


def _row(cell: Cell, key: MethodKey | None, label: str, records: Sequence[Mapping], ci: CIOptions,
         reference: Sequence[Mapping] | None = None, **extra) -> dict:
    metrics = table_metrics(cell.task)
    row: dict[str, Any] = {**cell.as_dict(), "method": label, "config_method": key.method if key else None,
                           "params": key.params_dict() if key else {}, "n": len(records),
                           "metrics": metric_estimates(records, metrics, ci) if records else {m: None for m in metrics}}
    if reference is not None:
        row["delta"] = paired_deltas(records, reference, delta_metrics(cell.task), ci) if records else None
    row.update(extra)
    return row


# ---------------------------------------------------------------------------- tau choice


def choose_tau(mean_by_tau: Mapping[float, float], tolerance: float = TAU_TIE_TOLERANCE) -> float:
    """The tau with the best mean score; ties -> the tau closest to 1, then the smaller one."""
    if not mean_by_tau:
        raise ConfigError("no UniAttnS temperatures to choose from")
    best = max(mean_by_tau.values())
    tied = [float(t) for t, m in mean_by_tau.items() if m >= best - tolerance]
    # rounded: 0.85 and 1.15 are equally close to 1 despite binary floats
    return min(tied, key=lambda t: (round(abs(t - 1.0), 9), t))


def tau_sweep(records: Iterable[Mapping], metric: str = MRCR.metrics.primary,
              ci: CIOptions = CIOptions(), grid: Collection[float] | None = None) -> dict[str, dict]:
    """Per model: every UniAttnS tau's mean MRCR score (pooled over lengths) and the tau chosen
    among those of `grid` (None: every stored tau). Temperatures off the grid stay in the rows,
    marked, so an older sweep in the same store is shown but never chosen."""
    on_grid = None if grid is None else {round(float(t), 9) for t in grid}
    by_model: dict[str, dict[float, list[Mapping]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        key = method_key(r)
        if r.get("task") == MRCR.name and key.method == "uniattns" and r.get(metric) is not None:
            by_model[str(r["model"])][key.value("tau")].append(r)
    out = {}
    for model, by_tau in sorted(by_model.items()):
        rows = [{"tau": tau, "n": len(recs), "lengths": sorted({int(r.get("length") or 0) for r in recs}),
                 metric: bootstrap_ci([float(r[metric]) for r in recs], n_boot=ci.n_boot, seed=ci.seed).as_dict(),
                 **({} if on_grid is None else {"on_grid": round(tau, 9) in on_grid})}
                for tau, recs in sorted(by_tau.items())]
        means = {tau: sum(float(r[metric]) for r in recs) / len(recs) for tau, recs in by_tau.items()
                 if on_grid is None or round(tau, 9) in on_grid}
        if not means:
            continue
        best = max(means.values())
        tied = sum(1 for m in means.values() if m >= best - TAU_TIE_TOLERANCE)
        out[model] = {"rows": rows, "chosen_tau": choose_tau(means), "tied": tied > 1,
                      "all_tied": tied == len(means) > 1}
        if grid is not None:
            out[model]["grid"] = [float(t) for t in grid]
    return out


# ---------------------------------------------------------------------------- Path Traversal table


def pt_table(records: Iterable[Mapping], chosen_tau: Mapping[str, float], ci: CIOptions = CIOptions(),
             task: str = PATH_TRAVERSAL.name) -> tuple[list[dict], list[str]]:
    """vanilla / UniAttnS (chosen tau) / DySCO per (model, length, setting), deltas vs vanilla.
    What it cannot show is named in a note: teacher-forced records, other methods' records."""
    rows, notes = [], []
    mine = [r for r in records if r.get("task") == task]
    forced = TASKS[task].metrics.forced if task in TASKS else ()
    n_forced = sum(1 for r in mine if any(r.get(m) is not None for m in forced))
    if n_forced:
        notes.append(f"{n_forced} of the {len(mine)} records are teacher-forced: this table reads freely decoded "
                     "results, so their cells show '-'; analyses/preset_table.py tabulates teacher-forced stores")
    for cell, by_key in group(mine).items():
        vanilla_key = MethodKey("vanilla")
        vanilla = by_key.get(vanilla_key, [])
        where = f"{cell.model} {cell.length}"
        if not vanilla:
            notes.append(f"{where}: no vanilla records; deltas vs vanilla are empty")
        rows.append(_row(cell, vanilla_key, "vanilla", vanilla, ci, role="vanilla"))
        taus = {k.value("tau"): recs for k, recs in by_key.items() if k.method == "uniattns"}
        tau = chosen_tau.get(cell.model)
        if tau is None and not taus:
            notes.append(f"{where}: no UniAttnS records and no MRCR tau sweep for {cell.model}")
        if tau is None:
            if taus:
                notes.append(f"{where}: no MRCR tau sweep for {cell.model}; every stored UniAttnS tau is shown")
            for t, recs in sorted(taus.items()):
                rows.append(_row(cell, MethodKey("uniattns", (("tau", t),)), f"UniAttnS (tau={t:g}, not chosen)",
                                 recs, ci, vanilla, role="uniattns", tau_source="stored, no sweep"))
        elif tau in taus:
            rows.append(_row(cell, MethodKey("uniattns", (("tau", tau),)), f"UniAttnS (tau={tau:g})", taus[tau],
                             ci, vanilla, role="uniattns", tau_source="MRCR sweep"))
        elif tau == 1.0 and vanilla:
            # tau = 1 leaves every score unchanged: UniAttnS is vanilla decoding
            rows.append(_row(cell, MethodKey("uniattns", (("tau", 1.0),)), "UniAttnS (tau=1 = vanilla)", vanilla,
                             ci, vanilla, role="uniattns", tau_source="MRCR sweep; tau=1 is vanilla"))
        else:
            notes.append(f"{where}: UniAttnS at the chosen tau={tau:g} was not evaluated"
                         + (f" (stored: {', '.join(f'{t:g}' for t in sorted(taus))})" if taus else ""))
            rows.append(_row(cell, MethodKey("uniattns", (("tau", tau),)), f"UniAttnS (tau={tau:g})", [], ci,
                             vanilla, role="uniattns", tau_source="MRCR sweep; not evaluated"))
        other = sorted(t for t in taus if tau is not None and t != tau)
        if other:
            notes.append(f"{where}: UniAttnS also stored at tau {', '.join(f'{t:g}' for t in other)} "
                         "(not the MRCR choice; left out)")
        dysco = sorted((k for k in by_key if k.method == "dysco"), key=lambda k: (not k.is_default, k))
        if not dysco:
            notes.append(f"{where}: no DySCO records")
        for k in dysco:
            rows.append(_row(cell, k, k.label, by_key[k], ci, vanilla, role="dysco"))
        skipped = sorted({k.label for k in by_key if k.method in ("dysco-random", "dysco-static", "dysco-reuse")})
        if skipped:
            notes.append(f"{where}: ablation records left to the ablation table: {', '.join(skipped)}")
        for k in sorted(k for k in by_key if k.method not in ("vanilla", "uniattns", *_ABLATION_ORDER)):
            notes.append(f"{where}: {len(by_key[k])} {k.label} records left out: this table shows vanilla, "
                         "UniAttnS and DySCO")
    return rows, notes


# ---------------------------------------------------------------------------- ablation table

_ABLATION_ORDER = {"dysco": 0, "dysco-random": 1, "dysco-static": 2, "dysco-reuse": 3}


def ablation_table(records: Iterable[Mapping], ci: CIOptions = CIOptions()) -> tuple[list[dict], list[str]]:
    """DySCO vs its random-head, static and one-pass (reuse) variants at equal DySCO parameters;
    deltas vs DySCO."""
    rows, notes = [], []
    for cell, by_key in group(records).items():
        families: dict[tuple, dict[MethodKey, list[Mapping]]] = defaultdict(dict)
        for k, recs in by_key.items():
            if k.method in _ABLATION_ORDER:
                families[k.scaling_params()][k] = recs
        for params, members in sorted(families.items(), key=lambda kv: (not MethodKey("dysco", kv[0]).is_default,
                                                                          kv[0])):
            if not any(k.method != "dysco" for k in members):
                continue  # DySCO alone: not an ablation
            base_key = next((k for k in members if k.method == "dysco"), None)
            base = members.get(base_key, []) if base_key else []
            deviations = MethodKey("dysco", params).deviations()
            suffix = ", ".join(f"{k}={v}" for k, v in deviations.items())
            if base_key is None:
                notes.append(f"{cell.model} {cell.task} {cell.length}: no DySCO run with the variants' parameters"
                             + (f" ({suffix})" if suffix else ""))
            for k in sorted(members, key=lambda k: (_ABLATION_ORDER[k.method], k)):
                rows.append(_row(cell, k, k.label, members[k], ci, None if k.method == "dysco" else base,
                                 variant=k.method))
    if not rows:
        notes.append("no dysco-random, dysco-static or dysco-reuse records")
    return rows, notes


# ---------------------------------------------------------------------------- robustness


def robustness_points(records: Iterable[Mapping], ci: CIOptions = CIOptions()) -> tuple[list[dict], list[str]]:
    """One point per (cell, parameter, value): DySCO runs off the default in at most that parameter.

    The default run is the shared point of every parameter's curve. Runs that also move
    another DySCO parameter (decay, warm-up, template masking) or two robustness
    parameters at once are left out, with a note.
    """
    points, notes = [], []
    for cell, by_key in group(r for r in records if method_key(r).method == "dysco").items():
        default: tuple[MethodKey, list[Mapping]] | None = None
        varied: defaultdict[str, dict[Any, tuple[MethodKey, list[Mapping]]]] = defaultdict(dict)
        for k, recs in by_key.items():
            dev = k.deviations(protocol=False)
            others = [d for d in dev if d not in ROBUSTNESS_PARAMS]
            moved = [d for d in dev if d in ROBUSTNESS_PARAMS]
            if others or len(moved) > 1:
                notes.append(f"{cell.model} {cell.task} {cell.length}: {k.label} moves "
                             f"{', '.join(others + moved)} at once; left out")
            elif not moved:
                default = (k, recs)
            else:
                varied[moved[0]][dev[moved[0]]] = (k, recs)
        if default is None:
            notes.append(f"{cell.model} {cell.task} {cell.length}: no run at the default parameters")
        for param in ROBUSTNESS_PARAMS:
            values = dict(varied.get(param, {}))
            if default is not None:
                values[default_value(param)] = default
            for value, (k, recs) in sorted(values.items()):
                points.append(_row(cell, k, k.label, recs, ci, param=param, value=value,
                                   is_default=value == default_value(param)))
    return points, notes
