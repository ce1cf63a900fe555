"""What one teacher-forced run fixes and breaks against another, step by step (pure: records in,
classes out).

A teacher-forced gain is an average over steps one method gets right where the other does not
("fixed"), steps it gets wrong where the other was right ("broken"), and steps both get right
or both wrong. Records pair by instance (content hash) within each (model, task, length). A
step is a route step where the records carry `tf_step_correct` (Path Traversal), else a gold
token (`tf_token_correct`, every task). Rates are shares of steps, averaged over instances, with
a percentile-bootstrap interval over instances (steps of one instance are not independent);
"net" (fixed minus broken) is the paired difference in step accuracy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dysco_interp.analysis.bootstrap import bootstrap_ci
from dysco_interp.errors import ConfigError

CLASSES = ("fixed", "broken", "both right", "both wrong")
UNITS = {"tf_step_correct": "route step", "tf_token_correct": "gold token"}
# per-step values a record may carry beside its correctness, kept with each classified step
STEP_FIELDS = ("tf_step_margin", "tf_step_city_logprob")


def class_of(base: bool, other: bool) -> str:
    """The class of a step that `base` got right or not and `other` got right or not."""
    if other != base:
        return "fixed" if other else "broken"
    return "both right" if base else "both wrong"


def units_of(record: Mapping) -> str:
    """The field that holds a record's per-step correctness (route steps before tokens)."""
    for field in UNITS:
        if isinstance(record.get(field), list):
            return field
    raise ConfigError(f"record of {record.get('method')!r} on instance {record.get('instance')!r} holds no "
                      "per-step correctness (tf_step_correct or tf_token_correct): it was not decoded teacher "
                      "forced, or by a version before per-step scores were stored")


def classify(base: Iterable[Mapping], other: Iterable[Mapping]) -> list[dict]:
    """One row per step of every instance both runs decoded: its cell, instance, step, class,
    and each side's per-step values (`STEP_FIELDS`, where the records carry them)."""
    def by_instance(records: Iterable[Mapping]) -> dict[tuple, Mapping]:
        return {(r["model"], r["task"], r.get("length"), r["instance"]): r for r in records}

    mine, theirs = by_instance(base), by_instance(other)
    rows = []
    for key in sorted(set(mine) & set(theirs), key=str):
        a, b = mine[key], theirs[key]
        field = units_of(a)
        if units_of(b) != field or len(a[field]) != len(b[field]):
            raise ConfigError(f"instance {key[3]!r} ({key[1]}, {key[2]} tokens): the two runs scored different "
                              "steps; were they decoded from the same data?")
        for step, (right_a, right_b) in enumerate(zip(a[field], b[field])):
            row: dict[str, Any] = {"model": key[0], "task": key[1], "length": key[2], "instance": key[3],
                                   "step": step, "unit": UNITS[field], "class": class_of(bool(right_a), bool(right_b))}
            for name in STEP_FIELDS:
                for side, record in (("base", a), ("other", b)):
                    values = record.get(name)
                    if isinstance(values, list) and step < len(values):
                        row[f"{side}_{name.removeprefix('tf_step_')}"] = values[step]
            rows.append(row)
    return rows


def class_rates(rows: Sequence[Mapping], n_boot: int = 2000, seed: int = 0) -> list[dict]:
    """Per (model, task, length): instances, steps, and each class's share of steps (mean over
    instances of each instance's share) with its interval, and net = fixed - broken."""
    cells: dict[tuple, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        cells[(r["model"], r["task"], r["length"])][r["instance"]].append(r["class"])
    out = []
    for (model, task, length), instances in sorted(cells.items(), key=lambda kv: str(kv[0])):
        shares = {c: [steps.count(c) / len(steps) for steps in instances.values()] for c in CLASSES}
        net = [f - b for f, b in zip(shares["fixed"], shares["broken"])]
        out.append({"model": model, "task": task, "length": length, "instances": len(instances),
                    "steps": sum(len(s) for s in instances.values()),
                    "counts": {c: sum(s.count(c) for s in instances.values()) for c in CLASSES},
                    "rates": {c: bootstrap_ci(v, n_boot=n_boot, seed=seed).as_dict() for c, v in shares.items()},
                    "net": bootstrap_ci(net, n_boot=n_boot, seed=seed).as_dict()})
    return out
