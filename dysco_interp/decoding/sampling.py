"""Next-token choice: greedy, or seeded temperature / top-k / top-p sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dysco_interp.errors import ConfigError


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; a seed makes sampling reproducible."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self):
        if not (self.temperature >= 0 and self.temperature != float("inf")):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingConfig()


class Sampler:
    """Picks tokens from float logits [batch, vocab]; owns its random generator."""

    def __init__(self, config: SamplingConfig = GREEDY, device: torch.device | str = "cpu"):
        self.config = config
        self.generator = None
        if not config.greedy:
            self.generator = torch.Generator(device=device)
            if config.seed is not None:
                self.generator.manual_seed(config.seed)
            else:
                self.generator.seed()

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if cfg.greedy:
            return logits.argmax(dim=-1)
        scores = logits.float() / cfg.temperature
        if cfg.top_k:
            kth = torch.topk(scores, min(cfg.top_k, scores.shape[-1]), dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if cfg.top_p < 1:
            sorted_scores, order = scores.sort(dim=-1, descending=True)
            cum = sorted_scores.softmax(-1).cumsum(-1)
            # drop a token once the mass before it already reaches top_p; the best always stays
            drop = (cum - sorted_scores.softmax(-1)) >= cfg.top_p
            sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
            scores = torch.full_like(scores, float("-inf")).scatter(-1, order, sorted_scores)
        probs = scores.softmax(dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
