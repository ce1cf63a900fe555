"""MRCR's `TaskSpec`: generator, make-data flag, evaluation and metrics."""

from __future__ import annotations

from dysco_interp.argtypes import positive_int
from dysco_interp.tasks.mrcr.generate import generate_example
from dysco_interp.tasks.mrcr.instance import TASK, MRCRExample
from dysco_interp.tasks.mrcr.score import score_response
from dysco_interp.tasks.spec import DataFlag, Evaluation, TableMetric, TaskMetrics, TaskSpec

MRCR = TaskSpec(
    name=TASK,
    title="MRCR",
    generate=generate_example,
    instance_type=MRCRExample,
    options=("n_needles", "n_turns", "k", "form", "topic", "tolerance", "enable_thinking"),
    summary=lambda x: {"tokens": x.n_tokens, "turns": x.n_turns, "needles": x.n_needles},
    evaluation=Evaluation(
        prompt=lambda x: x.messages,
        spans=lambda x: {f"turn{i}": tuple(s) for i, s in enumerate(x.message_token_spans)},
        gold_steps=lambda x, n: [(x.n_tokens - 1 + j, f"turn{x.gold_message_index}") for j in range(n)],
        score=score_response,
        gold=lambda x: x.answer,
    ),
    metrics=TaskMetrics(
        free=("score",),
        forced=("tf_logprob", "tf_token_accuracy", "tf_exact"),
        primary="score",
        primary_forced="tf_logprob",
        tables=(TableMetric("score", "score", "score", compared=True),),
    ),
    flags=(DataFlag("--needles", "n_needles", "times the request repeats (2, 4 or 8; default 4)", type=positive_int),),
)

__all__ = ["MRCR"]
