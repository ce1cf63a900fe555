"""The DySCO decode loop (and its baselines), on the shared runtime and plain TL hooks.

Schedule for one prompt (the paper's algorithm):
1. encode with the chat template; n_gen = generation-prompt tokens;
2. prefill prompt[:-(T_w + n_gen)] without intervention (shareable across methods);
3. context warm-up: the next T_w tokens one at a time, no bias, relevance updated;
4. intervention warm-up: the n_gen generation-prompt tokens with the full step;
5. decode with the full step until EOS or the budget.
Full step: partial pass (layers 0..max_layer(H*), no bias, no cache write) -> update
relevance -> select (nucleus <= p, cap K, no template tokens) -> biased full pass that
writes the cache and gives the next logits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from dysco_interp.chat import EncodedPrompt, Messages, as_messages, encode_chat
from dysco_interp.decoding import relevance, runtime
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.generate import GenerationResult, Timings, decode_until_done
from dysco_interp.decoding.interventions import AttentionTemperature, BiasWriter, RelevanceReader
from dysco_interp.decoding.sampling import Sampler
from dysco_interp.decoding.template import extend_mask, template_positions
from dysco_interp.decoding.trace import SpanMass, StepRecord, Trace
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet, random_like
from dysco_interp.models import LoadedModel

Spans = Mapping[str, tuple[int, int]] | Sequence[tuple[int, int]]


@dataclass
class Prefix:
    """A prefilled cache for prompt[:n_tokens], reusable by methods that keep prefill attention."""

    cache: object
    n_tokens: int
    prefill_s: float


@dataclass
class PreparedPrompt:
    encoded: EncodedPrompt
    template: torch.Tensor  # bool [n_prompt]: chat-template tokens (never selected)

    @property
    def ids(self) -> tuple[int, ...]:
        return self.encoded.input_ids


def prepare_prompt(
    model: LoadedModel, prompt: str | Messages | EncodedPrompt, enable_thinking: bool | None = None
) -> PreparedPrompt:
    """Chat-encode a prompt and find its template tokens."""
    if isinstance(prompt, EncodedPrompt):
        raise ConfigError("pass the prompt text or messages, so template tokens can be located")
    messages = as_messages(prompt)
    encoded = encode_chat(model.tokenizer, messages, enable_thinking)
    return PreparedPrompt(encoded, template_positions(encoded, messages, model.tokenizer, enable_thinking))


def tail_length(n_prompt: int, n_gen: int, warmup: int) -> int:
    """Prompt tokens fed one at a time after the prefill (at least one token is prefilled)."""
    return min(warmup + n_gen, n_prompt - 1)


def prefill_prefix(
    model: LoadedModel, prepared: PreparedPrompt, config: DecodingConfig, chunk_size: int = runtime.DEFAULT_CHUNK
) -> Prefix:
    """Prefill everything but the warm-up and generation-prompt tokens."""
    ids = prepared.ids
    n_prefix = len(ids) - tail_length(len(ids), prepared.encoded.n_generation_prompt, config.warmup)
    hooks = AttentionTemperature(model.spec, config.tau).hooks() if config.changes_prefill else []
    t0 = time.perf_counter()
    cache, _ = runtime.prefill(model, ids[:n_prefix], chunk_size=chunk_size, hooks=hooks)
    return Prefix(cache, n_prefix, time.perf_counter() - t0)


def resolve_heads(model: LoadedModel, heads: HeadSet | None, config: DecodingConfig) -> HeadSet | None:
    if not config.uses_heads:
        return None
    if heads is None or len(heads) == 0:
        raise ConfigError(f"method {config.method!r} needs a non-empty head set (H*)")
    heads = heads.validate_for(model.spec)
    if config.method == "dysco-random":
        heads = random_like(heads, model.spec, seed=config.head_seed)
    return heads


class _Stepper:
    """Runs one token through the model according to the method; owns the relevance state."""

    def __init__(self, model, config, heads, template, span_mass):
        self.model, self.config, self.template, self.span_mass = model, config, template, span_mass
        self.method = config.method
        self.reader = RelevanceReader(heads, model.spec) if heads is not None else None
        self.writer = BiasWriter(model.spec)
        self.plain_hooks = AttentionTemperature(model.spec, config.tau).hooks() if self.method == "uniattns" else []
        self.relevance: torch.Tensor | None = None
        self.static: relevance.Selection | None = None

    def _read(self, cache, token, n_keys: int, partial: bool):
        self.reader.set_length(n_keys)
        if partial:
            runtime.partial_step(self.model, cache, token, self.reader.max_layer + 1, self.reader.hooks())
        self.relevance = relevance.update_relevance(self.reader.attention(), self.relevance, self.config.decay)

    def _select(self, n_keys: int) -> relevance.Selection:
        # the prompt's template tokens so far; generated tokens stay selectable
        exclude = extend_mask(self.template[:n_keys], n_keys)[None] if self.config.template_masking else None
        return relevance.select_keys(self.relevance, self.config.top_p, self.config.top_k, exclude)

    def _record(self, record: StepRecord, selection: relevance.Selection | None) -> StepRecord:
        if selection is not None:
            record.n_selected = int(selection.count[0])
            record.nucleus_mass = round(float(selection.mass[0]), 6)
            if self.config.record_positions:
                record.selected = selection.mask[0].nonzero().flatten().tolist()
        if self.span_mass is not None and self.relevance is not None:
            record.top_spans = self.span_mass.top_spans(self.relevance[0])
        return record

    def context_warmup(self, cache, token, position: int) -> tuple[torch.Tensor, StepRecord]:
        token = torch.tensor([[token]])
        if self.reader is None:
            logits = runtime.step(self.model, cache, token, self.plain_hooks)
        else:
            self.reader.set_length(position + 1)
            logits = runtime.step(self.model, cache, token, self.reader.hooks())
            self.relevance = relevance.update_relevance(self.reader.attention(), self.relevance, self.config.decay)
        return logits, self._record(StepRecord("context-warmup", position, int(token)), None)

    def full_step(self, cache, token: int, position: int, phase: str) -> tuple[torch.Tensor, StepRecord]:
        t = torch.tensor([[token]])
        n_keys = position + 1
        selection = None
        if self.reader is None:
            logits = runtime.step(self.model, cache, t, self.plain_hooks)
            return logits, StepRecord(phase, position, token)
        if self.method == "dysco-static":
            if self.static is None:
                if self.relevance is None:  # no context warm-up: select from this token's partial pass
                    self._read(cache, t, n_keys, partial=True)
                self.static = self._select(self.relevance.shape[-1])
            selection = self.static
            mask = torch.nn.functional.pad(selection.mask, (0, n_keys - selection.mask.shape[-1]))
        else:
            self._read(cache, t, n_keys, partial=True)
            selection = self._select(n_keys)
            mask = selection.mask
        self.writer.set_bias(relevance.scaling_bias(mask, self.config.beta))
        logits = runtime.step(self.model, cache, t, self.writer.hooks())
        return logits, self._record(StepRecord(phase, position, token), selection)


def dysco_generate(
    model: LoadedModel,
    prompt: str | Messages,
    heads: HeadSet | None = None,
    config: DecodingConfig = DecodingConfig(),
    spans: Spans | None = None,
    prefix: Prefix | None = None,
    prepared: PreparedPrompt | None = None,
) -> GenerationResult:
    """Generate with one method; returns text, tokens and a per-step `Trace`.

    `heads`: the QRHeads (H*) for the dysco methods. `spans`: named token spans of the
    prompt (edges, documents) whose relevance mass the trace reports. `prefix`: a cache
    from `prefill_prefix` to branch from (it is copied, not consumed).
    """
    prepared = prepared or prepare_prompt(model, prompt, config.enable_thinking)
    ids = prepared.ids
    n_prompt, n_gen = len(ids), prepared.encoded.n_generation_prompt
    model.check_fits(n_prompt, config.max_new_tokens)
    heads = resolve_heads(model, heads, config)
    timings = Timings(n_prompt=n_prompt)

    n_prefix = n_prompt - tail_length(n_prompt, n_gen, config.warmup)
    if prefix is None or config.changes_prefill:
        prefix = prefill_prefix(model, prepared, config)
    elif prefix.n_tokens != n_prefix:
        raise ValueError(f"the shared prefix covers {prefix.n_tokens} tokens, this method needs {n_prefix}")
    cache = runtime.clone_cache(prefix.cache)
    timings.prefill_s = prefix.prefill_s

    span_mass = SpanMass(spans, n_prompt) if spans is not None else None
    stepper = _Stepper(model, config, heads, prepared.template, span_mass)
    trace = Trace(config.method, n_prompt, list(heads) if heads is not None else [])
    sampler = Sampler(config.sampling, model.device)

    t0 = time.perf_counter()
    logits = None
    for pos in range(n_prefix, n_prompt - n_gen):
        logits, record = stepper.context_warmup(cache, ids[pos], pos)
        trace.steps.append(record)
    for pos in range(max(n_prefix, n_prompt - n_gen), n_prompt):
        logits, record = stepper.full_step(cache, ids[pos], pos, "intervention-warmup")
        trace.steps.append(record)
    warm_s = time.perf_counter() - t0

    def decode_step(token: int, n_out: int) -> torch.Tensor:
        logits, record = stepper.full_step(cache, token, n_prompt + n_out - 1, "decode")
        trace.steps.append(record)
        return logits

    t0 = time.perf_counter()
    out, finished = decode_until_done(logits, sampler, model.eos_token_ids, config.max_new_tokens, decode_step)
    timings.decode_s = time.perf_counter() - t0
    timings.warmup_s = warm_s
    timings.n_new = len(out)
    text = model.tokenizer.decode(out, skip_special_tokens=True)
    return GenerationResult(text, out, list(ids), finished, timings, trace=trace, method=config.method)


def compare_methods(
    model: LoadedModel,
    prompt: str | Messages,
    configs: Mapping[str, DecodingConfig],
    heads: HeadSet | None = None,
    spans: Spans | None = None,
    prepared: PreparedPrompt | None = None,
) -> dict[str, GenerationResult]:
    """Run several methods on one prompt, prefilling once for all that keep prefill attention.

    `prepared`: the prompt already encoded with the configs' (one) `enable_thinking`.
    """
    results: dict[str, GenerationResult] = {}
    shared: dict[tuple, Prefix] = {}
    prepared_by_thinking: dict = {}
    if prepared is not None:
        thinking = {c.enable_thinking for c in configs.values()}
        if len(thinking) != 1:
            raise ConfigError("a prepared prompt serves configs with one enable_thinking setting")
        prepared_by_thinking[thinking.pop()] = prepared
    for name, config in configs.items():
        prepared = prepared_by_thinking.get(config.enable_thinking)
        if prepared is None:
            prepared = prepared_by_thinking[config.enable_thinking] = prepare_prompt(model, prompt, config.enable_thinking)
        prefix = None
        if not config.changes_prefill:
            key = (config.enable_thinking, config.warmup)
            if key not in shared:
                shared[key] = prefill_prefix(model, prepared, config)
            prefix = shared[key]
        results[name] = dysco_generate(model, prompt, heads, config, spans, prefix, prepared)
    return results
