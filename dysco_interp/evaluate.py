"""Evaluate decoding methods on a task dataset, one stored record per (instance, method).

Methods that keep prefill attention share one prefill per instance (or batch of instances).
Records go to a `ResultStore`, so a killed run resumes without redoing finished items.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from tqdm.auto import tqdm

from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.dysco import iter_methods, prepare_prompt
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
    backend: str = "bridge",
    batch_size: int = 1,
) -> list[dict]:
    """Run every method on every instance not yet in the store; return the new records.

    `backend="sdpa"` or `"static"` with `batch_size > 1` decodes that many instances together; the
    records of each method are stored as soon as that method has finished the batch.
    """
    if task not in ADAPTERS:
        raise ConfigError(f"no evaluation for task {task!r}; choose one of {', '.join(ADAPTERS)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    adapter = ADAPTERS[task]

    def key(inst, method):
        return {"model": model_name, "task": task, "length": inst.target_tokens, "method": method,
                "seed": seed, "index": inst.index, "id": inst.id}

    todo = [inst for inst in instances if any(key(inst, m) not in store for m in methods)]
    new: list[dict] = []
    bar = tqdm(total=len(todo), desc=f"{task} x {len(methods)} methods", disable=not progress)
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        pending = {m: c for m, c in methods.items() if any(key(inst, m) not in store for inst in batch)}
        thinking = {inst.enable_thinking for inst in batch}
        if len(thinking) != 1:
            raise ConfigError("instances decoded together must share enable_thinking")
        thinking = thinking.pop()
        prompts = [adapter.prompt(inst) for inst in batch]
        prepared = [prepare_prompt(model, p, thinking) for p in prompts]
        for inst, prep in zip(batch, prepared):
            check_same_tokenizer(inst, len(prep.ids))
        pending = {m: c.replace(enable_thinking=thinking) for m, c in pending.items()}
        # each method's records are stored as soon as it finishes, so a kill loses at most one
        # span masses cost a host copy of the relevance every step: only for traces that are kept
        spans = [adapter.spans(i) for i in batch] if keep_trace else None
        results = iter_methods(model, prompts, pending, heads, spans=spans, prepared=prepared, backend=backend)
        for method, rows in results:
            for inst, res in zip(batch, rows):
                if key(inst, method) in store:
                    continue
                record = {
                    **key(inst, method),
                    "n_tokens": inst.n_tokens,
                    "output": res.text,
                    "finished": res.finished,
                    **adapter.score(res.text, inst),
                    "timings": res.timings.as_dict(),
                    "config": {k: v for k, v in vars(pending[method]).items() if k != "sampling"},
                    "backend": backend,
                }
                if keep_trace and res.trace is not None:
                    record["trace"] = res.trace.to_dict()
                store.append(record)
                new.append(record)
        bar.update(len(batch))
    bar.close()
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
