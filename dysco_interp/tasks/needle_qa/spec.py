"""Needle QA's `TaskSpec`: generator, make-data flag, evaluation and metrics."""

from __future__ import annotations

from dysco_interp.argtypes import unit_interval
from dysco_interp.tasks.needle_qa.generate import generate_example
from dysco_interp.tasks.needle_qa.instance import INSTRUCTION, LATE_INSTRUCTION, TASK, NeedleQAExample
from dysco_interp.tasks.needle_qa.score import score_answer
from dysco_interp.tasks.spec import DataFlag, Evaluation, TaskMetrics, TaskSpec

NEEDLE_QA = TaskSpec(
    name=TASK,
    title="Needle QA",
    generate=generate_example,
    instance_type=NeedleQAExample,
    options=("n_docs", "gold_position", "kinds", "tolerance", "enable_thinking"),
    summary=lambda x: {"tokens": x.n_tokens, "docs": x.n_docs, "gold_doc": x.gold_index},
    evaluation=Evaluation(
        prompt=lambda x: x.prompt,
        spans=lambda x: {f"doc{i}": tuple(s) for i, s in enumerate(x.doc_token_spans)},
        gold_steps=lambda x, n: [(x.n_tokens - 1 + j, f"doc{x.gold_index}") for j in range(n)],
        score=score_answer,
        gold=lambda x: x.answers[0],
        unscorable=lambda x: "a null-query example (for calibration) has no answer to score" if x.is_null_query
        else None,
    ),
    # no `tables`: the paper's tables report Path Traversal and MRCR only
    metrics=TaskMetrics(
        free=("exact_match", "contains"),
        forced=("tf_exact", "tf_logprob", "tf_token_accuracy"),
        primary="exact_match",
        primary_forced="tf_logprob",
    ),
    flags=(DataFlag("--gold-position", "gold_position", "relative depth of the gold document (0-1)",
                    type=unit_interval),),
    aliases=("needle-qa", "needleqa", "qa", "nq"),
    instruction=(INSTRUCTION, LATE_INSTRUCTION),  # the question itself differs per instance
)

__all__ = ["NEEDLE_QA"]
