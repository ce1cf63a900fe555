"""What decoding gives back: the generated text and tokens, timings, and the per-step trace."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Mapping, get_args

from dysco_interp.atomic import atomic_open
from dysco_interp.errors import DataError

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
    # with a span-mass read (`read=Read(..., returns="span_mass")`): each read head's
    # attention mass over each span, in the pass that kept the token
    read_mass: list[list[float]] | None = None
    # the method's own values of this step for this row (`Method.step_values`; None: it keeps none)
    own: dict[str, Any] | None = None


@dataclass(frozen=True)
class TokenStep:
    """A generated (or, teacher forced, gold) token and the step whose logits chose it: that
    step fed the token before it, so its selection is the one this token was predicted under."""

    token: int
    text: str | None  # the token as a string (with a tokenizer), `to_str_tokens` style
    step: StepRecord


@dataclass
class Trace:
    """The per-step record of one decode loop: a `StepRecord` for every token fed after the prefill.

    Each step has its phase (warm-up or decode), position and, under DySCO, the selection it made;
    `method`, `n_prompt` and `heads` (the QRHeads used) say what ran. `token_steps` pairs each
    generated token with the step that chose it."""

    method: str
    n_prompt: int
    heads: list[tuple[int, int]] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)

    def decode_steps(self) -> list[StepRecord]:
        """The steps that fed generated tokens (one fewer than the tokens: the last is never fed).
        To pair each token with the selection it was predicted under, use `token_steps`."""
        return [s for s in self.steps if s.phase == DECODE]

    def token_steps(self, tokens: list[int], tokenizer=None) -> list[TokenStep]:
        """Each of `tokens` (the result's generated tokens) with the step that chose it: the last
        prompt step for the first token, then the decode step that fed the token before."""
        prompt = [s for s in self.steps if s.phase != DECODE]
        producers = prompt[-1:] + self.decode_steps()
        if len(producers) < len(tokens):
            raise ValueError(f"{len(tokens)} tokens but only {len(producers)} steps that produced tokens in the trace")
        texts = [tokenizer.decode([t]) for t in tokens] if tokenizer is not None else [None] * len(tokens)
        return [TokenStep(t, text, step) for t, text, step in zip(tokens, texts, producers)]

    def to_dict(self) -> dict:
        out = asdict(self)
        for step in out["steps"]:  # a step with no values of the method's own is written as before
            if step["own"] is None:
                del step["own"]
        return out

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
    """Teacher forcing: at each gold token, what the model would have written, how likely the
    gold token was (natural log), and how sure the model was of its own choice (`margin`: the
    log-probability gap between its first and second choice), from the logits that predict it."""

    argmax: list[int]
    logprob: list[float]
    margin: list[float] = field(default_factory=list)  # empty in results saved before it existed

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self, gold: list[int]) -> dict[str, Any]:
        """Answer-level scores against the gold tokens fed: mean log-probability per token, the
        share of tokens that are the argmax, whether all are (greedy would write the answer), and
        per token whether it is the argmax (`tf_token_correct`, what `analysis.step_classes` pairs)."""
        n = len(self.argmax)
        correct = [a == g for a, g in zip(self.argmax, gold)]
        hits = sum(correct)
        return {"tf_logprob": sum(self.logprob) / n, "tf_token_accuracy": hits / n, "tf_exact": float(hits == n),
                "n_forced": n, "tf_token_correct": correct}


@dataclass
class GenerationResult:
    """What decoding one prompt gives back: the generated text and tokens, the prompt, timings and the per-step `Trace`.

    `trace` is None only for `decoding.reference`'s plain generation, outside the method loop;
    `forced` holds the gold tokens' scores under teacher forcing. `save` and `load` keep a result
    as JSON."""

    text: str
    tokens: list[int]
    prompt_ids: list[int]
    finished: bool  # stopped on an end-of-sequence token (else on the token budget)
    timings: Timings = field(default_factory=Timings)
    trace: Trace | None = None  # per-step record of the DySCO loop (None for plain `generate`)
    method: str = "plain"
    forced: ForcedScores | None = None  # teacher-forced decoding: the scores of the gold tokens fed
    # the prompt as text: the rendered chat template (chat=True), the text as given (chat=False),
    # or the token ids decoded; `prompt_ids` are its tokens
    prompt_text: str | None = None
    # format-forced decoding: per token, whether the model chose it (content) or it was forced (format)
    chosen: list[bool] | None = None

    def token_steps(self, tokenizer=None) -> list[TokenStep]:
        """Every generated token with the step (selection, nucleus mass, top spans) that chose it;
        with a tokenizer (`model.tokenizer`) each carries its text."""
        if self.trace is None:
            raise ValueError("this result has no trace (plain generate): nothing selected its tokens")
        return self.trace.token_steps(self.tokens, tokenizer)

    def to_dict(self) -> dict[str, Any]:
        """Everything, as JSON-ready values (timings exact, not rounded as in `Timings.as_dict`)."""
        return {
            "format": RESULT_FORMAT,
            "format_version": RESULT_FORMAT_VERSION,
            "text": self.text,
            "tokens": list(self.tokens),
            "prompt_ids": list(self.prompt_ids),
            "prompt_text": self.prompt_text,
            "finished": self.finished,
            "method": self.method,
            "timings": asdict(self.timings),
            "trace": None if self.trace is None else self.trace.to_dict(),
            "forced": None if self.forced is None else self.forced.to_dict(),
            "chosen": None if self.chosen is None else list(self.chosen),
        }

    @classmethod
    def from_dict(cls, d: Any, source: str = "<dict>") -> "GenerationResult":
        """The result that `to_dict` described; DataError naming `source` for anything else."""
        if not isinstance(d, Mapping) or d.get("format") != RESULT_FORMAT:
            got = d.get("format") if isinstance(d, Mapping) else type(d).__name__
            raise DataError(f"{source}: not a saved generation result (format {RESULT_FORMAT!r}), got {got!r}")
        if d.get("format_version") != RESULT_FORMAT_VERSION:
            raise DataError(f"{source}: generation result format_version {d.get('format_version')!r} is not "
                            f"{RESULT_FORMAT_VERSION}; saved by another dysco-interp version")
        try:
            timing_names = {f.name for f in fields(Timings)}
            trace, forced = d["trace"], d["forced"]
            prompt_text = d.get("prompt_text")  # absent from results saved before it was kept
            chosen = d.get("chosen")  # likewise
            return cls(
                text=str(d["text"]),
                tokens=[int(t) for t in d["tokens"]],
                prompt_ids=[int(t) for t in d["prompt_ids"]],
                finished=bool(d["finished"]),
                timings=Timings(**{k: v for k, v in d["timings"].items() if k in timing_names}),
                trace=None if trace is None else Trace.from_dict(trace),
                method=str(d["method"]),
                forced=None if forced is None else ForcedScores(list(forced["argmax"]), list(forced["logprob"]),
                                                                list(forced.get("margin", []))),
                prompt_text=None if prompt_text is None else str(prompt_text),
                chosen=None if chosen is None else [bool(c) for c in chosen],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DataError(f"{source}: malformed generation result ({type(e).__name__}: {e})") from None

    def save(self, path: str | os.PathLike) -> Path:
        """Write the result as JSON, atomically (temp file + rename); returns the path."""
        path = Path(path)
        with atomic_open(path) as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "GenerationResult":
        """Read a result that `save` wrote (JSON only: nothing in the file is run)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise DataError(f"generation result file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"cannot read generation result {path}: {e}") from None
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise DataError(f"{path}: not a JSON generation result ({e})") from None
        return cls.from_dict(obj, source=str(path))


RESULT_FORMAT = "dysco-interp/generation-result"
RESULT_FORMAT_VERSION = 1
