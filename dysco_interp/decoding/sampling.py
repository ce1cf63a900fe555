"""Next-token choice: greedy, or seeded temperature / top-k / top-p sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dysco_interp.checks import check_int, check_number, check_seed


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; a seed makes sampling reproducible.

    Every field is type-checked: a string, None or bool where a number belongs is a ConfigError
    that names the field.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self):
        check_number("temperature", self.temperature, at_least=0)
        check_number("top_p", self.top_p, above=0, at_most=1)
        check_int("top_k", self.top_k, minimum=0)
        if self.seed is not None:
            check_seed("seed", self.seed)

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
