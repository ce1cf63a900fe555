"""A Path Traversal instance: LongProc's record rendered with the chat template, with every span."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dysco_interp.chat import EncodedPrompt, Span, content_spans, encode_chat, encode_text
from dysco_interp.tasks.base import SpanRecord, prompt_fields, token_spans
from dysco_interp.tasks.path_traversal.graph import RouteGraph, follow_route
from dysco_interp.tasks.path_traversal.longproc import (
    CONTEXT_OFFSET,
    ROUTE_OPEN,
    Edge,
    format_context,
    format_prompt,
    gold_completion,
)

TASK = "path_traversal"


@dataclass
class PathTraversalInstance(SpanRecord):
    """One prompt in LongProc's schema plus the spans analyses need.

    Spans are half-open. Character spans index `prompt_text` (the rendered chat, generation
    prompt included); token spans index the ids `encode_chat` gives for it. `step_token_spans`
    index the concatenation prompt ids + ids of `completion` (the gold answer), one span per
    step: the destination city name written in that step.
    """

    id: str
    problem_description: str
    context_repr: list[dict]
    question_repr: list[str]
    answer_repr: list[dict]
    context_nl: str
    question_nl: str
    answer_nl: str
    prompt: str
    prompt_text: str
    n_tokens: int
    n_generation_prompt: int
    edge_char_spans: list[Span]
    edge_token_spans: list[Span]
    gold_edge_indices: list[int]
    completion: str
    completion_n_tokens: int
    step_char_spans: list[Span]  # in `completion`
    step_token_spans: list[Span]  # in prompt ids + completion ids
    task: str = TASK
    seed: int | None = None
    index: int | None = None
    target_tokens: int | None = None
    topology: str | None = None
    tokenizer: str | None = None
    enable_thinking: bool | None = None
    source: str = "dysco_interp"
    extra: dict = field(default_factory=dict)

    SPAN_LIST_FIELDS = ("edge_char_spans", "edge_token_spans", "step_char_spans", "step_token_spans")

    def span_bounds(self) -> dict[str, tuple[int, str]]:
        n_ids = self.n_tokens + self.completion_n_tokens
        return {**super().span_bounds(),
                "step_char_spans": (len(self.completion), f"the gold answer's {len(self.completion)} characters"),
                "step_token_spans": (n_ids, f"the {n_ids} tokens of the prompt and its gold answer")}

    def problem(self) -> str | None:
        n = len(self.context_repr)
        if not len(self.edge_char_spans) == len(self.edge_token_spans) == n:
            return f"it has {n} edges but {len(self.edge_token_spans)} edge spans"
        bad = next((i for i in self.gold_edge_indices if not 0 <= i < n), None)
        if bad is not None:
            return f"'gold_edge_indices' holds {bad}, not one of its {n} edges"
        return None

    @property
    def n_hops(self) -> int:
        return len(self.answer_repr)

    @property
    def n_edges(self) -> int:
        return len(self.context_repr)

    @property
    def edges(self) -> list[Edge]:
        return [Edge.from_dict(e) for e in self.context_repr]

    @property
    def edge_lines(self) -> list[str]:
        return [self.prompt_text[a:b] for a, b in self.edge_char_spans]

    @property
    def reference_output(self) -> str:
        """What LongProc's evaluator compares against (its `reference_output`)."""
        return self.answer_nl

    def longproc_record(self) -> dict:
        """The instance in LongProc's data schema (what path_traversal_*.json holds)."""
        keys = (
            "problem_description",
            "context_repr",
            "question_repr",
            "answer_repr",
            "context_nl",
            "question_nl",
            "answer_nl",
        )
        return {k: getattr(self, k) for k in keys}


def build_instance(
    graph: RouteGraph,
    tokenizer,
    *,
    id: str = "",
    enable_thinking: bool | None = None,
    **meta,
) -> PathTraversalInstance:
    """Render a graph with LongProc's prompt and the chat template, recording every span."""
    record = graph.longproc_record()
    context_nl, line_spans = format_context(graph.edges)
    prompt = format_prompt(context_nl, graph.start, graph.dest)
    enc = encode_chat(tokenizer, prompt, enable_thinking=enable_thinking)
    ((user_start, _),) = content_spans(enc, prompt, tokenizer, enable_thinking)
    base = user_start + CONTEXT_OFFSET
    char_spans = [(base + a, base + b) for a, b in line_spans]
    completion = gold_completion(record["answer_nl"])
    step_chars, comp_spans, n_comp = _step_spans(tokenizer, completion, graph.steps)
    return PathTraversalInstance(
        id=id,
        **record,
        prompt=prompt,
        edge_char_spans=char_spans,
        edge_token_spans=token_spans(enc, char_spans),
        gold_edge_indices=list(graph.route),
        completion=completion,
        completion_n_tokens=n_comp,
        step_char_spans=step_chars,
        step_token_spans=[(a + len(enc), b + len(enc)) for a, b in comp_spans],
        **prompt_fields(enc, tokenizer, enable_thinking),
        **meta,
    )


def _step_spans(tokenizer, completion: str, steps: Sequence[Edge]) -> tuple[list[Span], list[Span], int]:
    """Character spans (in the completion) of each step's destination city, and their tokens."""
    ids, offsets = encode_text(tokenizer, completion)
    enc = EncodedPrompt(completion, tuple(ids), tuple(offsets), 0)
    chars, pos = [], len(ROUTE_OPEN) + 1
    for e in steps:
        line = e.step
        start = pos + line.rindex(f" to {e.dst}.") + len(" to ")
        chars.append((start, start + len(e.dst)))
        pos += len(line) + 1
    return chars, token_spans(enc, chars), len(ids)


def from_longproc(
    record: dict, tokenizer, *, id: str = "", enable_thinking: bool | None = None
) -> PathTraversalInstance:
    """Our instance (spans included) for one record of LongProc's released data."""
    edges = tuple(Edge.from_dict(e) for e in record["context_repr"])
    start, dest = record["question_repr"]
    route = follow_route(edges, start, dest)
    if [edges[i].to_dict() for i in route] != [dict(e) for e in record["answer_repr"]]:
        raise ValueError("the record's answer_repr is not the route its context_repr implies")
    if format_context(edges)[0] != record["context_nl"]:
        raise ValueError("the record's context_nl differs from LongProc's edge format")
    return build_instance(
        RouteGraph(edges, tuple(route)), tokenizer, id=id, enable_thinking=enable_thinking, source="longproc"
    )
