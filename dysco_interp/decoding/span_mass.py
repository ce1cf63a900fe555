"""Relevance mass per named token span of the prompt (edge lines, documents), for the trace."""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

Spans = Mapping[str, tuple[int, int]] | Sequence[tuple[int, int]]


class SpanMass:
    """Sums relevance per named token span (edges, documents) without per-step loops."""

    def __init__(self, spans: Spans, n_prompt: int, top: int = 3):
        items = list(spans.items()) if isinstance(spans, Mapping) else [(str(i), s) for i, s in enumerate(spans)]
        self.names = [name for name, _ in items]
        segment = torch.full((n_prompt,), -1, dtype=torch.long)
        for i, (_, (start, end)) in enumerate(items):
            if not 0 <= start < end <= n_prompt:
                raise ValueError(f"span {items[i][0]!r} = ({start}, {end}) is outside the prompt of {n_prompt} tokens")
            segment[start:end] = i
        self.segment = segment
        self.top = top

    def masses(self, relevance: torch.Tensor) -> torch.Tensor:
        """Relevance mass per span, float32 [n_spans], for one row of relevance."""
        n = self.segment.shape[0]
        r = relevance[:n].float().cpu()
        r = torch.nn.functional.pad(r, (0, n - r.shape[0]))  # during warm-up r is shorter than the prompt
        inside = self.segment >= 0
        return torch.zeros(len(self.names)).index_add_(0, self.segment[inside], r[inside])

    def top_spans(self, relevance: torch.Tensor) -> list[tuple[str, float]]:
        m = self.masses(relevance)
        values, idx = torch.topk(m, min(self.top, len(self.names)))
        return [(self.names[i], round(float(v), 6)) for v, i in zip(values, idx.tolist())]
