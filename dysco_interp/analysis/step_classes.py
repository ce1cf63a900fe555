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
from dysco_interp.chat import Span
from dysco_interp.errors import ConfigError
from dysco_interp.tasks import get_task

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


def share_in_span(positions: Sequence[int], span: Span) -> float | None:
    """The share of `positions` inside the half-open `span` (None for no positions)."""
    return sum(span[0] <= p < span[1] for p in positions) / len(positions) if positions else None


def trace_signals(trace: Mapping, position: int, gold: Span, gold_name: str) -> dict[str, Any]:
    """What a kept trace says of the decoding step fed at `position`: how many keys the method
    selected and the relevance mass they held, the share of them inside the gold span (with
    recorded positions), and the gold span's place among the trace's most relevant spans (None
    when it is not among them). Empty when the trace has no such step or the method selects nothing."""
    step = next((s for s in trace.get("steps", []) if s.get("position") == position), None)
    if step is None or step.get("n_selected") is None:
        return {}
    out: dict[str, Any] = {"n_selected": step["n_selected"], "selected_mass": step.get("nucleus_mass")}
    if step.get("selected") is not None and step["n_selected"]:
        out["gold_selected_share"] = share_in_span(step["selected"], gold)
    if step.get("top_spans"):
        names = [name for name, _ in step["top_spans"]]
        out["gold_top_span_rank"] = names.index(gold_name) + 1 if gold_name in names else None
        total = sum(mass for _, mass in step["top_spans"])
        out["gold_top_span_mass"] = next((mass for name, mass in step["top_spans"] if name == gold_name), 0.0)
        out["top_span_share"] = step["top_spans"][0][1] / total if total > 0 else None
    return out


def classify(base: Iterable[Mapping], other: Iterable[Mapping],
             instances: Mapping[str, Any] | None = None) -> list[dict]:
    """One row per step of every instance both runs decoded: its cell, instance, step, class,
    and each side's per-step values (`STEP_FIELDS`, where the records carry them).

    With `instances` (instance id -> the task's instance, as `load_dataset` reads them) and
    records that kept their traces (`evaluate --keep-trace`), each row also gets `trace_signals`
    of the compared run at the step, read against the step's gold span (`Evaluation.gold_steps`)."""
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
        gold = gold_steps_of(b, instances, len(b[field])) if instances is not None else None
        for step, (right_a, right_b) in enumerate(zip(a[field], b[field])):
            row: dict[str, Any] = {"model": key[0], "task": key[1], "length": key[2], "instance": key[3],
                                   "step": step, "unit": UNITS[field], "class": class_of(bool(right_a), bool(right_b))}
            for name in STEP_FIELDS:
                for side, record in (("base", a), ("other", b)):
                    values = record.get(name)
                    if isinstance(values, list) and step < len(values):
                        row[f"{side}_{name.removeprefix('tf_step_')}"] = values[step]
            if gold is not None and step < len(gold):
                position, span_name, span = gold[step]
                row.update({f"other_{k}": v for k, v in trace_signals(b["trace"], position, span, span_name).items()})
            rows.append(row)
    return rows


def gold_steps_of(record: Mapping, instances: Mapping[str, Any], n: int) -> list[tuple[int, str, Span]]:
    """(position, gold span name, gold span) of each of the record's first n scored steps."""
    instance = instances.get(str(record.get("id")))
    if instance is None:
        raise ConfigError(f"the data holds no instance {record.get('id')!r}: pass the task file the runs decoded")
    if record.get("trace") is None:
        raise ConfigError(f"the record of {record.get('method')!r} on {record.get('id')!r} kept no trace: decode "
                          "with --keep-trace")
    evaluation = get_task(record["task"]).evaluation
    gold = evaluation.gold_steps(instance, n)
    if gold is None:
        raise ConfigError(f"task {record['task']!r} marks no gold spans to read a trace against")
    spans = evaluation.spans(instance) or {}
    return [(position, name, (int(spans[name][0]), int(spans[name][1]))) for position, name in gold]


def class_rates(rows: Sequence[Mapping], n_boot: int = 2000, seed: int = 0) -> list[dict]:
    """Per (model, task, length): instances, steps, and each class's share of steps (mean over
    instances of each instance's share) with its interval, and net = fixed - broken."""
    cells: dict[tuple, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        cells[(r["model"], r["task"], r["length"])][r["instance"]].append(r["class"])
    out = []
    def order(cell: tuple) -> tuple:
        model, task, length = cell
        return str(model), str(task), length if isinstance(length, (int, float)) else -1

    for (model, task, length), instances in sorted(cells.items(), key=lambda kv: order(kv[0])):
        shares = {c: [steps.count(c) / len(steps) for steps in instances.values()] for c in CLASSES}
        net = [f - b for f, b in zip(shares["fixed"], shares["broken"])]
        out.append({"model": model, "task": task, "length": length, "instances": len(instances),
                    "steps": sum(len(s) for s in instances.values()),
                    "counts": {c: sum(s.count(c) for s in instances.values()) for c in CLASSES},
                    "rates": {c: bootstrap_ci(v, n_boot=n_boot, seed=seed).as_dict() for c, v in shares.items()},
                    "net": bootstrap_ci(net, n_boot=n_boot, seed=seed).as_dict()})
    return out
