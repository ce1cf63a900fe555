"""Attention per context edge while the gold route is teacher-forced (the paper's Figure 3 inputs).

At each route step, the query is the position that predicts the next city's first token.
Every head's attention row there is summed over each edge line's token span, giving
`masses[step, layer, head, edge]`; the metrics then compare head sets (QRHeads vs random
heads) on the gold edge's mass and on whether the gold edge ranks in the top 5% of edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from dysco_interp.decoding import runtime
from dysco_interp.models import LoadedModel
from dysco_interp.tasks.path_traversal import PathTraversalInstance, teacher_forced_inputs


def span_sums(rows: torch.Tensor, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Sum of `rows[..., start:end]` for every half-open span: `[..., n_spans]`, float32."""
    if not spans:
        raise ValueError("no spans to sum over")
    bounds = torch.tensor(spans, dtype=torch.long, device=rows.device)
    if bounds.min() < 0 or bounds[:, 1].max() > rows.shape[-1] or (bounds[:, 1] <= bounds[:, 0]).any():
        raise ValueError(f"spans must be non-empty and inside the {rows.shape[-1]} keys")
    cum = torch.nn.functional.pad(rows.float().cumsum(-1), (1, 0))
    return cum[..., bounds[:, 1]] - cum[..., bounds[:, 0]]


def in_top_fraction(scores: torch.Tensor, gold: torch.Tensor, fraction: float = 0.05) -> torch.Tensor:
    """Whether the gold span is among the top ceil(fraction * n) spans by score (bool `[...]`)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    k = max(1, math.ceil(fraction * scores.shape[-1]))
    top = scores.topk(k, dim=-1).indices
    return (top == gold.unsqueeze(-1)).any(-1)


@dataclass(frozen=True)
class EdgeAttention:
    """Per-step, per-head attention mass on every edge of one instance."""

    masses: torch.Tensor  # float32 [n_steps, n_layers, n_heads, n_edges]
    gold: torch.Tensor  # long [n_steps]: the gold edge of each step

    def for_heads(self, heads: Iterable[tuple[int, int]]) -> torch.Tensor:
        """Mean over the given heads: `[n_steps, n_edges]`."""
        idx = torch.tensor(list(heads), dtype=torch.long)
        return self.masses[:, idx[:, 0], idx[:, 1]].mean(1)

    def gold_mass(self, heads: Iterable[tuple[int, int]]) -> torch.Tensor:
        """Attention mass the heads put on each step's gold edge: `[n_steps]`."""
        per_edge = self.for_heads(heads)
        return per_edge.gather(1, self.gold[:, None])[:, 0]

    def gold_in_top(self, heads: Iterable[tuple[int, int]], fraction: float = 0.05) -> torch.Tensor:
        """Per step, whether the gold edge is in the heads' top `fraction` of edges: bool `[n_steps]`."""
        return in_top_fraction(self.for_heads(heads), self.gold, fraction)


@torch.inference_mode()
def teacher_forced_edge_attention(model: LoadedModel, instance: PathTraversalInstance) -> EdgeAttention:
    """Every head's edge masses at each gold step, from one pass over the gold answer."""
    spec = model.spec
    if spec.sliding_window is not None:
        raise ValueError("edge attention needs full-attention layers; sliding-window models are not supported")
    inputs = teacher_forced_inputs(instance, model.tokenizer)
    n_prompt = inputs.prompt_len
    ids = runtime.as_ids(model, inputs.input_ids)
    model.check_fits(ids.shape[1])
    rows_at = torch.tensor(inputs.first_token_positions, dtype=torch.long) - n_prompt
    if (rows_at < 0).any():
        raise ValueError("a route step is predicted from inside the prompt; the answer format is unexpected")
    spans = [tuple(s) for s in instance.edge_token_spans]
    masses = torch.empty(len(rows_at), spec.n_layers, spec.n_heads, len(spans))

    def read(pattern: torch.Tensor, hook) -> None:
        layer = int(hook.name.split(".")[1])
        rows = pattern[0, :, rows_at.to(pattern.device), :n_prompt]  # [H, steps, n_prompt]
        masses[:, layer] = span_sums(rows, spans).transpose(0, 1).cpu()

    cache, _ = runtime.prefill(model, ids[:, :n_prompt])
    hooks = [(f"blocks.{layer}.attn.hook_pattern", read) for layer in range(spec.n_layers)]
    model.bridge.run_with_hooks(ids[:, n_prompt:], past_key_values=cache, fwd_hooks=hooks, logits_to_keep=1)
    return EdgeAttention(masses, torch.tensor(instance.gold_edge_indices, dtype=torch.long))
