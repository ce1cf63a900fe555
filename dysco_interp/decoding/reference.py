"""Vanilla decoding written directly on the shared runtime (prefill, then one cached step per
token): the reference that the tests hold the method loop (`dysco_interp.generate`) to."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from dysco_interp.chat import Messages, encode_chat
from dysco_interp.checks import brief, check_int, check_type, is_int, typed
from dysco_interp.decoding import runtime
from dysco_interp.decoding.results import GenerationResult, Timings
from dysco_interp.decoding.sampling import GREEDY, Sampler, SamplingConfig
from dysco_interp.errors import ConfigError
from dysco_interp.models import LoadedModel


def prompt_ids(
    model: LoadedModel, prompt: str | Messages | Sequence[int], enable_thinking: bool | None = None
) -> list[int]:
    """Token ids of a prompt: raw ids pass through, text and messages get the chat template."""
    if prompt is None:
        raise ConfigError("prompt is None; pass text, chat messages or token ids")
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError("prompt is empty")
        return list(encode_chat(model.tokenizer, prompt, enable_thinking).input_ids)
    if isinstance(prompt, (bytes, dict)) or not hasattr(prompt, "__len__") or len(prompt) == 0:
        raise ConfigError(f"prompt must be text, chat messages or token ids, got {typed(prompt)}")
    if isinstance(prompt[0], dict):
        return list(encode_chat(model.tokenizer, list(prompt), enable_thinking).input_ids)  # type: ignore[arg-type]
    if not all(is_int(t) for t in prompt):
        raise ConfigError(f"prompt token ids must be integers, got {brief(list(prompt[:8]))}")
    return [int(t) for t in prompt]  # type: ignore[arg-type]


def decode_until_done(
    logits: torch.Tensor,
    sampler: Sampler,
    eos: frozenset[int],
    max_new_tokens: int,
    step: Callable[[int, int], torch.Tensor],
) -> tuple[list[int], bool]:
    """Sample, stop on EOS or the budget, else `step(token, n_generated)` for the next logits.

    Returns the generated tokens and whether an end-of-sequence token ended them.
    """
    out: list[int] = []
    while True:
        token = int(sampler(logits)[0])
        out.append(token)
        if token in eos:
            return out, True
        if len(out) >= max_new_tokens:
            return out, False
        logits = step(token, len(out))


def reference_generate(
    model: LoadedModel,
    prompt: str | Messages | Sequence[int],
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    enable_thinking: bool | None = None,
    chunk_size: int = runtime.DEFAULT_CHUNK,
) -> GenerationResult:
    """Plain generation (no intervention) with the bridge decoding on a prefilled cache, outside
    the method loop (its result has no trace)."""
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_type("sampling", sampling, SamplingConfig)
    ids = prompt_ids(model, prompt, enable_thinking)
    model.check_fits(len(ids), max_new_tokens)
    sampler = Sampler(sampling, model.device)
    timings = Timings(n_prompt=len(ids))

    t0 = time.perf_counter()
    cache, logits = runtime.prefill(model, ids, chunk_size=chunk_size)
    timings.prefill_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    out, finished = decode_until_done(
        logits, sampler, model.eos_token_ids, max_new_tokens,
        lambda token, n_out: runtime.step(model, cache, torch.tensor([[token]])),
    )
    timings.decode_s = time.perf_counter() - t0
    timings.n_new = len(out)
    text = model.tokenizer.decode(out, skip_special_tokens=True)
    return GenerationResult(text, out, ids, finished, timings)
