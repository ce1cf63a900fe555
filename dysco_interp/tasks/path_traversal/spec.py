"""Path Traversal's `TaskSpec`: generator, make-data flags, evaluation and metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dysco_interp.argtypes import argument_type
from dysco_interp.errors import ConfigError
from dysco_interp.tasks.path_traversal.generate import generate_instance
from dysco_interp.tasks.path_traversal.graph import TOPOLOGIES
from dysco_interp.tasks.path_traversal.instance import TASK, PathTraversalInstance
from dysco_interp.tasks.path_traversal.longproc import INSTRUCTION, Edge, answer_segments
from dysco_interp.tasks.path_traversal.score import score_route
from dysco_interp.tasks.path_traversal.teacher_forcing import forced_step_scores, teacher_forced_inputs
from dysco_interp.tasks.spec import DataFlag, Evaluation, TableMetric, TaskMetrics, TaskSpec

if TYPE_CHECKING:
    from dysco_interp.decoding.results import GenerationResult


def parse_hops(text: str) -> int | list[int]:
    """'4' -> 4; '24,29,34,39' -> [24, 29, 34, 39]; '24-39' -> [24, ..., 39]."""
    text = str(text).strip()
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            if lo > hi:
                raise ValueError
            return list(range(lo, hi + 1))
        if "," in text:
            return [int(x) for x in text.split(",") if x.strip()]
        return int(text)
    except ValueError:
        # "value must": `argument_type` drops "value", argparse names the flag
        raise ConfigError(f"value must be N, a list such as 24,29,34,39, or a range such as 24-39, got {text!r}") \
            from None


def route_scores(text: str, instance: PathTraversalInstance) -> dict[str, float]:
    """LongProc's metrics and the step accuracy of a generated route (the parsed route left out)."""
    return {k: v for k, v in score_route(text, instance).to_dict().items() if k != "parsed"}


def route_segments(instance: PathTraversalInstance) -> list[tuple[str, bool]]:
    """The gold route's format (tags, step template, means of transport) and content (the cities)."""
    return answer_segments([Edge.from_dict(e) for e in instance.answer_repr])


def route_steps(result: GenerationResult, instance: PathTraversalInstance, tokenizer) -> Mapping[str, float | None]:
    """Teacher-forced step accuracy and city log-probability of a forced result."""
    assert result.forced is not None
    inputs = teacher_forced_inputs(instance, tokenizer)
    return forced_step_scores(result.forced.argmax, result.forced.logprob, inputs, result.forced.margin)


PATH_TRAVERSAL = TaskSpec(
    name=TASK,
    title="Path Traversal",
    generate=generate_instance,
    instance_type=PathTraversalInstance,
    options=("hops", "n_edges", "topology", "tolerance", "enable_thinking"),
    summary=lambda x: {"tokens": x.n_tokens, "hops": x.n_hops, "edges": x.n_edges},
    evaluation=Evaluation(
        prompt=lambda x: x.prompt,
        spans=lambda x: {f"edge{i}": tuple(s) for i, s in enumerate(x.edge_token_spans)},
        gold_steps=lambda x, n: [(a - 1, f"edge{e}") for (a, _), e in zip(x.step_token_spans[:n], x.gold_edge_indices)],
        score=route_scores,
        gold=lambda x: x.completion,
        score_forced=route_steps,
        segments=route_segments,
    ),
    metrics=TaskMetrics(
        free=("accuracy", "partial_accuracy", "step_accuracy", "extraction_rate"),
        forced=("tf_step_accuracy", "tf_city_logprob", "tf_logprob", "tf_token_accuracy"),
        primary="step_accuracy",
        primary_forced="tf_step_accuracy",
        extraction="extraction_rate",
        tables=(
            TableMetric("accuracy", "accuracy (exact)", "accuracy", compared=True),
            TableMetric("step_accuracy", "step accuracy", "step accuracy", compared=True),
            TableMetric("partial_accuracy", "partial accuracy", "partial accuracy"),
        ),
    ),
    flags=(
        DataFlag("--hops", "hops", "route length: N, a list '24,29,34,39' or a range '24-39' drawn per instance "
                 "(default 4)", type=argument_type(str, parse_hops)),
        DataFlag("--topology", "topology", "distractor edge process", choices=TOPOLOGIES),
    ),
    aliases=("path-traversal", "pathtraversal", "pt", "longproc"),
    instruction=INSTRUCTION,
)

__all__ = ["PATH_TRAVERSAL", "parse_hops", "route_scores", "route_segments", "route_steps"]
