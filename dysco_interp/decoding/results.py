"""What decoding gives back: the generated text and tokens, timings, and the per-step trace."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal, Mapping, get_args

Phase = Literal["context-warmup", "intervention-warmup", "decode"]
CONTEXT_WARMUP: Phase = "context-warmup"  # prompt tokens fed one at a time, relevance only
INTERVENTION_WARMUP: Phase = "intervention-warmup"  # the last prompt tokens, with the method's full step
DECODE: Phase = "decode"  # generated tokens
PHASES: tuple[Phase, ...] = (CONTEXT_WARMUP, INTERVENTION_WARMUP, DECODE)
assert PHASES == get_args(Phase)


@dataclass
class StepRecord:
    phase: Phase
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
        return [s for s in self.steps if s.phase == DECODE]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "Trace":
        def step(s: Mapping) -> StepRecord:
            spans = s.get("top_spans")
            return StepRecord(**{**s, "top_spans": [tuple(x) for x in spans] if spans else spans})

        steps = [step(s) for s in d["steps"]]
        return cls(d["method"], d["n_prompt"], [tuple(h) for h in d["heads"]], steps)


@dataclass
class Timings:
    prefill_s: float = 0.0
    warmup_s: float = 0.0  # prompt tokens fed one at a time (DySCO's warm-up)
    decode_s: float = 0.0
    n_prompt: int = 0
    n_new: int = 0
    batch_size: int = 1  # rows decoded together (the times are the batch's)

    @property
    def decode_tok_per_s(self) -> float:
        # the first token comes from the prefill logits; decode steps produce the rest
        steps = max(self.n_new - 1, 0)
        return steps / self.decode_s if self.decode_s > 0 else float("nan")

    def as_dict(self) -> dict:
        return {
            "n_prompt": self.n_prompt,
            "n_new": self.n_new,
            "batch_size": self.batch_size,
            "prefill_s": round(self.prefill_s, 4),
            "warmup_s": round(self.warmup_s, 4),
            "decode_s": round(self.decode_s, 4),
            "decode_tok_per_s": round(self.decode_tok_per_s, 3),
        }


@dataclass
class ForcedScores:
    """Teacher forcing: at each gold token, what the model would have written and how likely
    the gold token was (natural log), from the logits that predict it."""

    argmax: list[int]
    logprob: list[float]

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self, gold: list[int]) -> dict[str, float]:
        """Answer-level scores against the gold tokens fed: mean log-probability per token, the
        share of tokens that are the argmax, whether all are (greedy would write the answer)."""
        n = len(self.argmax)
        hits = sum(int(a == g) for a, g in zip(self.argmax, gold))
        return {"tf_logprob": sum(self.logprob) / n, "tf_token_accuracy": hits / n, "tf_exact": float(hits == n),
                "n_forced": n}


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    prompt_ids: list[int]
    finished: bool  # stopped on an end-of-sequence token (else on the token budget)
    timings: Timings = field(default_factory=Timings)
    trace: Trace | None = None  # per-step record of the DySCO loop (None for plain `generate`)
    method: str = "plain"
    forced: ForcedScores | None = None  # teacher-forced decoding: the scores of the gold tokens fed
