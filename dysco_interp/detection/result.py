"""DetectionResult: head scores with what produced them, and their exports (ranking, HeadSet)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dysco_interp.detection.methods import DEFAULT_TOP_K
from dysco_interp.detection.scores import mean_over_examples, rank_heads
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.heads.detected_on import DetectionData
from dysco_interp.hooks import Head


def matrix_to_json(t: torch.Tensor, mask: torch.Tensor) -> list[list[float | None]]:
    """A score matrix as JSON rows, null where `mask` is False (stores and head files carry it)."""
    vals = t.double().tolist()
    keep = mask.tolist()
    return [[v if k else None for v, k in zip(row, krow)] for row, krow in zip(vals, keep)]


def matrix_from_json(rows: list[list[float | None]]) -> torch.Tensor:
    """`matrix_to_json`'s rows back as float64, 0 where null."""
    return torch.tensor([[0.0 if v is None else v for v in row] for row in rows], dtype=torch.float64)


@dataclass
class DetectionResult:
    """Head scores `[n_layers, n_heads]` (-1 = not scored) and what produced them."""

    scores: torch.Tensor
    scored: torch.Tensor  # bool [L, H]: -1 in `scores` is also a possible value, this is not ambiguous
    per_example: list[torch.Tensor]  # [L, H] float64 each, in example order
    example_ids: list[str]
    method: str
    model: str
    n_layers: int
    n_heads: int
    n_kv_heads: int | None
    data: str
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    detected_on: tuple[DetectionData, ...] = ()  # the task instances scored, for the leakage check

    def ranking(self) -> list[tuple[Head, float]]:
        return rank_heads(self.scores, self.scored)

    def headset(self, top_k: int = DEFAULT_TOP_K, command: str | None = None) -> HeadSet:
        """The top-k heads by score, with provenance."""
        ranked = self.ranking()
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ConfigError(f"top_k must be a positive integer, got {top_k!r}")
        if top_k > len(ranked):
            raise ConfigError(
                f"top_k={top_k} is larger than the {len(ranked)} scored heads of {self.model} "
                f"({self.n_layers} layers x {self.n_heads} heads)"
            )
        top = ranked[:top_k]
        return HeadSet(
            heads=[h for h, _ in top],
            scores=[s for _, s in top],
            model=self.model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            method=self.method,
            data=self.data,
            n_examples=len(self.per_example),
            seed=self.seed,
            command=command,
            detected_on=self.detected_on,
            extra={
                **self.extra,
                "n_scored_heads": len(ranked),
                "top_k_of": len(ranked),
                "score_matrix": matrix_to_json(self.scores, self.scored),
            },
        )

    def subset(self, indices: Sequence[int]) -> DetectionResult:
        """The same detection aggregated over some of the examples only."""
        if not indices:
            raise ConfigError("an empty subset of examples")
        per = [self.per_example[i] for i in indices]
        return dataclasses.replace(
            self,
            scores=mean_over_examples(per, self.scored),
            per_example=per,
            example_ids=[self.example_ids[i] for i in indices],
        )
