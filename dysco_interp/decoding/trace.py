"""What happened at each decoding step: how much was selected, and where relevance went."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

import torch

PHASES = ("context-warmup", "intervention-warmup", "decode")


@dataclass
class StepRecord:
    phase: str
    position: int  # absolute position of the token fed at this step
    token: int  # the token fed
    n_selected: int | None = None  # keys that got log(beta) (None: no selection this step)
    nucleus_mass: float | None = None  # relevance mass of the selected keys
    selected: list[int] | None = None  # selected positions (only with record_positions)
    top_spans: list[tuple[str, float]] | None = None  # most relevant named spans and their mass


@dataclass
class Trace:
    method: str
    n_prompt: int
    heads: list[tuple[int, int]] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)

    def decode_steps(self) -> list[StepRecord]:
        return [s for s in self.steps if s.phase == "decode"]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "Trace":
        steps = [StepRecord(**{**s, "top_spans": [tuple(x) for x in s["top_spans"]] if s.get("top_spans") else s.get("top_spans")}) for s in d["steps"]]
        return cls(d["method"], d["n_prompt"], [tuple(h) for h in d["heads"]], steps)


class SpanMass:
    """Sums relevance per named token span (edges, documents) without per-step loops."""

    def __init__(self, spans: Mapping[str, tuple[int, int]] | Sequence[tuple[int, int]], n_prompt: int, top: int = 3):
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
