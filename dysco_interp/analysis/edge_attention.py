"""Attention per context edge while the gold route is teacher-forced (the paper's Figure 3 inputs).

`teacher_forced_edge_attention` reads every head through the bridge in one pass over the answer;
`readout_edge_attention` reads chosen heads through any backend's read-outs, for lengths the
bridge cannot reach.

At each route step, the query is the position that predicts the next city's first token.
Every head's attention row there is summed over each edge line's token span, giving
`masses[step, layer, head, edge]`; the metrics then compare head sets (QRHeads vs random
heads) on the gold edge's mass and on whether the gold edge ranks in the top 5% of edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from dysco_interp.decoding import runtime
from dysco_interp.decoding.backends import BackendSpec
from dysco_interp.decoding.plan import PassPlan, Read
from dysco_interp.decoding.readout import span_sums
from dysco_interp.hooks import layer_of, pattern_name
from dysco_interp.models import LoadedModel
from dysco_interp.ranking import in_top_fraction
from dysco_interp.tasks.path_traversal import (
    PathTraversalInstance,
    teacher_forced_inputs,
    teacher_forced_step_accuracy,
)


@dataclass(frozen=True)
class EdgeAttention:
    """Per-step, per-head attention mass on every edge of one instance."""

    masses: torch.Tensor  # float32 [n_steps, n_layers, n_heads, n_edges]
    gold: torch.Tensor  # long [n_steps]: the gold edge of each step
    correct: tuple[bool, ...] | None = None  # per step, every city-name token is the argmax (if scored)

    def for_heads(self, heads: Iterable[tuple[int, int]]) -> torch.Tensor:
        """Mean over the given heads: `[n_steps, n_edges]`."""
        idx = torch.tensor(list(heads), dtype=torch.long)
        return self.masses[:, idx[:, 0], idx[:, 1]].mean(1)

    def gold_mass(self, heads: Iterable[tuple[int, int]]) -> torch.Tensor:
        """Attention mass the heads put on each step's gold edge: `[n_steps]`."""
        per_edge = self.for_heads(heads)
        return per_edge.gather(1, self.gold[:, None])[:, 0]

    def gold_in_top(self, heads: Iterable[tuple[int, int]], fraction: float = 0.05) -> torch.Tensor:
        """Per step, whether the gold edge is in the heads' top `fraction` of edges (ties count
        against it): bool `[n_steps]`."""
        return in_top_fraction(self.for_heads(heads), self.gold, fraction)


@torch.inference_mode()
def span_attention_by_layer(
    model: LoadedModel,
    input_ids,
    n_cached: int,
    rows_at: torch.Tensor,
    spans: Sequence[tuple[int, int]],
    consume: Callable[[int, torch.Tensor], None],
    logits_to_keep: int = 1,
) -> torch.Tensor:
    """Attention of chosen query rows summed over key spans, handed over one layer at a time.

    `input_ids[:n_cached]` is prefilled (no n x n scores); the rest runs through the bridge
    once, and only rows `rows_at` (offsets into that rest) are summed: `consume(layer, sums)`
    gets float32 `[n_heads, n_rows, n_spans]` for every layer. Returns that pass's logits for
    its last `logits_to_keep` positions (0: every position after the prefilled ones).
    """
    if model.spec.sliding_window is not None:
        raise ValueError("span attention needs full-attention layers; sliding-window models are not supported")
    ids = runtime.as_ids(model, input_ids)
    model.check_fits(ids.shape[1])
    if not 0 < n_cached < ids.shape[1]:
        raise ValueError(f"n_cached must leave at least one token to run, got {n_cached} of {ids.shape[1]}")
    rows_at = torch.as_tensor(rows_at, dtype=torch.long)
    if rows_at.numel() and (rows_at.min() < 0 or rows_at.max() >= ids.shape[1] - n_cached):
        raise ValueError("rows_at must index the tokens after the prefilled ones")

    def read(pattern: torch.Tensor, hook) -> None:
        rows = pattern[0, :, rows_at.to(pattern.device)]  # [H, rows, keys]
        consume(layer_of(hook), span_sums(rows, spans).cpu())

    cache, _ = runtime.prefill(model, ids[:, :n_cached])
    hooks = [(pattern_name(layer), read) for layer in range(model.spec.n_layers)]
    return model.bridge.run_with_hooks(
        ids[:, n_cached:], past_key_values=cache, fwd_hooks=hooks, logits_to_keep=logits_to_keep
    )


def teacher_forced_edge_attention(
    model: LoadedModel, instance: PathTraversalInstance, score_steps: bool = False
) -> EdgeAttention:
    """Every head's edge masses at each gold step, from one pass over the gold answer.

    With `score_steps` the same pass also scores each step (`correct`: every token of the
    city name is the argmax), at the cost of full-vocabulary logits for the answer tokens.
    """
    spec = model.spec
    inputs = teacher_forced_inputs(instance, model.tokenizer)
    n_prompt = inputs.prompt_len
    rows_at = torch.tensor(inputs.first_token_positions, dtype=torch.long) - n_prompt
    if (rows_at < 0).any():
        raise ValueError("a route step is predicted from inside the prompt; the answer format is unexpected")
    spans = [tuple(s) for s in instance.edge_token_spans]
    masses = torch.empty(len(rows_at), spec.n_layers, spec.n_heads, len(spans))

    def store(layer: int, sums: torch.Tensor) -> None:
        masses[:, layer] = sums.transpose(0, 1)

    logits = span_attention_by_layer(
        model, inputs.input_ids, n_prompt, rows_at, spans, store, logits_to_keep=0 if score_steps else 1
    )
    correct = None
    if score_steps:  # logits cover positions n_prompt.. ; earlier ones predict nothing scored
        predicted = [-1] * n_prompt + logits[0].argmax(-1).tolist()
        correct = teacher_forced_step_accuracy(predicted, inputs, "name").correct
    return EdgeAttention(masses, torch.tensor(instance.gold_edge_indices, dtype=torch.long), correct)


@torch.inference_mode()
def span_attention_by_readout(model: LoadedModel, input_ids: Sequence[int], rows_at: Sequence[int],
                              spans: Sequence[tuple[int, int]], heads: Iterable[tuple[int, int]],
                              backend: BackendSpec | str = "static",
                              feed_to: int | None = None) -> tuple[Read, torch.Tensor, torch.Tensor]:
    """The read-out twin of `span_attention_by_layer`: the attention rows of `heads` at the
    positions `rows_at` (ascending, absolute) summed over `spans`, through any backend. The ids
    up to the first row are prefilled, the rest fed one at a time (through position `feed_to`,
    default the last row) as plain passes whose read-out keeps only those heads' last-query
    rows: no pattern is ever built, so the static backend reaches 32K-128K tokens. Returns the
    read (its heads in order), float32 `[len(rows_at), len(read.heads), len(spans)]`, and the
    argmax next token at every fed position (long `[feed_to - rows_at[0] + 1]`)."""
    read = Read(heads, returns="span_mass", spans=spans)
    plan = PassPlan(reads=(read,))
    runner = BackendSpec.of(backend).make(model)
    ids = torch.tensor([list(input_ids)], dtype=torch.long, device=model.device)
    first, last = rows_at[0], rows_at[-1] if feed_to is None else feed_to
    if last < rows_at[-1] or last >= ids.shape[1]:
        raise ValueError(f"feed_to must lie between the last row and the last id, got {feed_to}")
    state = runner.prefill(ids[:, :first], None, reserve=last - first + 1)
    out = torch.empty(len(rows_at), len(read.heads), len(read.spans))
    argmax = torch.empty(last - first + 1, dtype=torch.long, device=model.device)
    wanted = {position: row for row, position in enumerate(rows_at)}
    for position in range(first, last + 1):
        step = runner.run(state, ids[:, position], plan)
        assert step.logits is not None
        argmax[position - first] = step.logits[0].argmax()
        mass = step.reads[0].span_mass
        if position in wanted:
            assert mass is not None
            out[wanted[position]] = mass[0].float().cpu()
    runner.check_faults()
    return read, out, argmax.cpu()


def readout_edge_attention(model: LoadedModel, instance: PathTraversalInstance, heads: Iterable[tuple[int, int]],
                           backend: BackendSpec | str = "static", score_steps: bool = False) -> EdgeAttention:
    """`teacher_forced_edge_attention` for the chosen heads only, through any backend's read-outs
    (`span_attention_by_readout`). Heads not read hold NaN in `masses`. With `score_steps` the
    feed runs on to the last city name's end, and each step is scored as there."""
    spec = model.spec
    inputs = teacher_forced_inputs(instance, model.tokenizer)
    rows_at = list(inputs.first_token_positions)
    if min(rows_at) < inputs.prompt_len - 1:
        raise ValueError("a route step is predicted from inside the prompt; the answer format is unexpected")
    spans = [(int(s), int(e)) for s, e in instance.edge_token_spans]
    feed_to = max(p for step in inputs.step_predict_positions for p in step) if score_steps else None
    read, sums, argmax = span_attention_by_readout(model, inputs.input_ids, rows_at, spans, heads, backend, feed_to)
    masses = torch.full((len(rows_at), spec.n_layers, spec.n_heads, len(spans)), float("nan"))
    index = torch.tensor(read.heads, dtype=torch.long)
    masses[:, index[:, 0], index[:, 1]] = sums
    correct = None
    if score_steps:  # positions before the first row predict nothing scored
        predicted = [-1] * rows_at[0] + argmax.tolist()
        predicted += [-1] * (len(inputs.input_ids) - len(predicted))
        correct = teacher_forced_step_accuracy(predicted, inputs, "name").correct
    return EdgeAttention(masses, torch.tensor(instance.gold_edge_indices, dtype=torch.long), correct)
