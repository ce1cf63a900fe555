"""Evaluate decoding methods on a task dataset, one stored record per (instance, method).

Methods that keep prefill attention share one prefill per instance (`compare_methods`).
Records go to a `ResultStore`, so a killed run resumes without redoing finished items.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from tqdm.auto import tqdm

from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.dysco import compare_methods, prepare_prompt
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel
from dysco_interp.runner import ResultStore
from dysco_interp.tasks import mrcr, needle_qa, path_traversal
from dysco_interp.tasks.common import check_same_tokenizer


@dataclass(frozen=True)
class TaskAdapter:
    """How to prompt, trace and score one task's instances."""

    prompt: Callable[[object], object]  # str or messages
    spans: Callable[[object], dict[str, tuple[int, int]] | None]
    score: Callable[[str, object], dict[str, float]]
    metrics: tuple[str, ...]  # the metrics the summary table shows


ADAPTERS: dict[str, TaskAdapter] = {
    "path_traversal": TaskAdapter(
        prompt=lambda x: x.prompt,
        spans=lambda x: {f"edge{i}": tuple(s) for i, s in enumerate(x.edge_token_spans)},
        score=lambda text, x: {
            k: v for k, v in path_traversal.score_route(text, x).to_dict().items() if k != "parsed"
        },
        metrics=("accuracy", "partial_accuracy", "step_accuracy", "extraction_rate"),
    ),
    "needle_qa": TaskAdapter(
        prompt=lambda x: x.prompt,
        spans=lambda x: {f"doc{i}": tuple(s) for i, s in enumerate(x.doc_token_spans)},
        score=lambda text, x: needle_qa.score_answer(text, x),
        metrics=("exact_match", "contains"),
    ),
    "mrcr": TaskAdapter(
        prompt=lambda x: x.messages,
        spans=lambda x: {f"turn{i}": tuple(s) for i, s in enumerate(x.message_token_spans)},
        score=lambda text, x: mrcr.score_response(text, x),
        metrics=("score",),
    ),
}


def evaluate(
    model: LoadedModel,
    model_name: str,
    task: str,
    instances: Iterable,
    methods: Mapping[str, DecodingConfig],
    heads: HeadSet | None,
    store: ResultStore,
    seed: int = 0,
    keep_trace: bool = False,
    progress: bool = True,
) -> list[dict]:
    """Run every method on every instance not yet in the store; return the new records."""
    if task not in ADAPTERS:
        raise ConfigError(f"no evaluation for task {task!r}; choose one of {', '.join(ADAPTERS)}")
    adapter = ADAPTERS[task]
    new: list[dict] = []
    for inst in tqdm(list(instances), desc=f"{task} x {len(methods)} methods", disable=not progress):
        def key(method):
            return {"model": model_name, "task": task, "length": inst.target_tokens, "method": method,
                    "seed": seed, "index": inst.index, "id": inst.id}

        pending = {m: c for m, c in methods.items() if key(m) not in store}
        if not pending:
            continue
        prompt = adapter.prompt(inst)
        prepared = prepare_prompt(model, prompt, inst.enable_thinking)
        check_same_tokenizer(inst, len(prepared.ids))
        pending = {m: c.replace(enable_thinking=inst.enable_thinking) for m, c in pending.items()}
        results = compare_methods(model, prompt, pending, heads, spans=adapter.spans(inst), prepared=prepared)
        for method, res in results.items():
            record = {
                **key(method),
                "n_tokens": inst.n_tokens,
                "output": res.text,
                "finished": res.finished,
                **adapter.score(res.text, inst),
                "timings": res.timings.as_dict(),
                "config": {k: v for k, v in vars(pending[method]).items() if k != "sampling"},
            }
            if keep_trace and res.trace is not None:
                record["trace"] = res.trace.to_dict()
            store.append(record)
            new.append(record)
    return new


def summarise(records: Iterable[dict], metrics: Iterable[str]) -> dict[tuple, dict[str, float]]:
    """Mean of each metric per (length, method), with the instance count."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["length"], r["method"])].append(r)
    out = {}
    for key, rows in sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
        out[key] = {"n": len(rows), **{m: sum(float(r.get(m, 0.0)) for r in rows) / len(rows) for m in metrics}}
    return out


def format_table(summary: Mapping[tuple, Mapping[str, float]], metrics: Iterable[str]) -> str:
    metrics = list(metrics)
    header = f"{'length':>8} {'method':16} {'n':>4} " + " ".join(f"{m:>17}" for m in metrics)
    lines = [header, "-" * len(header)]
    for (length, method), row in summary.items():
        lines.append(
            f"{length if length is not None else '-':>8} {method:16} {row['n']:>4} "
            + " ".join(f"{row[m]:>17.3f}" for m in metrics)
        )
    return "\n".join(lines)
