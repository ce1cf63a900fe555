"""The DySCO decode loop (and its baselines), for one prompt or a left-padded batch.

Schedule for one prompt (the paper's algorithm):
1. encode with the chat template; n_gen = generation-prompt tokens;
2. prefill prompt[:-(T_w + n_gen)] without intervention (shareable across methods);
3. context warm-up: the next T_w tokens one at a time, no bias, relevance updated;
4. intervention warm-up: the n_gen generation-prompt tokens with the full step;
5. decode with the full step until EOS or the budget.
Full step: partial pass (layers 0..max_layer(H*), no bias, no cache write) -> update
relevance -> select (nucleus <= p, cap K, no template tokens) -> biased full pass that
writes the cache and gives the next logits. "dysco-reuse" (beyond the paper) runs one pass:
layers 0..L* unbiased, the selection from their QRHeads, the bias in layers L*+1.. only.
The passes run on a backend (`backends.py`, `static.py`): TL hooks on the bridge, fast SDPA,
or SDPA prefill with CUDA-graph decoding steps on fixed KV buffers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from dysco_interp.chat import EncodedPrompt, Messages, as_messages, encode_chat
from dysco_interp.checks import typed
from dysco_interp.decoding import relevance, runtime
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.backends import DecodeState, check_backend, make_backend
from dysco_interp.decoding.generate import GenerationResult, Timings
from dysco_interp.decoding.sampling import Sampler
from dysco_interp.decoding.template import extend_mask, template_positions
from dysco_interp.decoding.trace import SpanMass, StepRecord, Trace
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet, random_like
from dysco_interp.models import LoadedModel

Spans = Mapping[str, tuple[int, int]] | Sequence[tuple[int, int]]


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



@dataclass
class Rows:
    """Prompts left-padded into one batch; one prompt is a batch of one with no pads."""

    prepared: list[PreparedPrompt]
    ids: torch.Tensor  # long [B, N]
    pads: list[int]
    template: torch.Tensor  # bool [B, N]: chat-template tokens (False at pads)
    valid: torch.Tensor | None  # bool [B, N]: False at pads; None when nothing is padded
    n_gen: int

    @classmethod
    def of(cls, prepared: Sequence[PreparedPrompt], pad_id: int) -> "Rows":
        if not prepared:
            raise ConfigError("no prompts to decode")
        n_gen = {p.encoded.n_generation_prompt for p in prepared}
        if len(n_gen) != 1:
            raise ConfigError("prompts decoded together must share the generation prompt (one chat template)")
        width = max(len(p.ids) for p in prepared)
        pads = [width - len(p.ids) for p in prepared]
        ids = torch.tensor([[pad_id] * k + list(p.ids) for p, k in zip(prepared, pads)], dtype=torch.long)
        template = torch.stack([torch.nn.functional.pad(p.template.to(torch.bool), (k, 0)) for p, k in zip(prepared, pads)])
        valid = None
        if any(pads):
            valid = torch.arange(width)[None, :] >= torch.tensor(pads)[:, None]
        return cls(list(prepared), ids, pads, template, valid, n_gen.pop())

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    def n_prefix(self, warmup: int) -> int:
        """Columns prefilled; the rest are fed one at a time. Rows share the schedule, which
        equals each row's own unless a prompt is shorter than warmup + n_gen + 1 tokens."""
        shortest = min(len(p.ids) for p in self.prepared)
        return self.width - tail_length(shortest, self.n_gen, warmup)

    def never_selected(self, template_masking: bool) -> torch.Tensor:
        """Pads always; chat-template tokens with template masking."""
        pads = torch.zeros_like(self.template) if self.valid is None else ~self.valid
        return pads | self.template if template_masking else pads


@dataclass
class Prefix:
    """A prefilled state for columns [0, n_tokens) of the rows, reusable by methods that keep
    prefill attention (it is copied, not consumed)."""

    state: DecodeState
    n_tokens: int
    prefill_s: float


def prefill_prefix(model: LoadedModel, rows: Rows, config: DecodingConfig, backend: str = "bridge",
                   chunk_size: int = runtime.DEFAULT_CHUNK) -> Prefix:
    """Prefill everything but the warm-up and generation-prompt tokens."""
    n_prefix = rows.n_prefix(config.warmup)
    runner = make_backend(model, backend, None, config.tau if config.changes_prefill else 1.0)
    valid = None if rows.valid is None else rows.valid[:, :n_prefix]
    t0 = time.perf_counter()
    reserve = rows.width - n_prefix + config.max_new_tokens
    state = runner.prefill(rows.ids[:, :n_prefix].to(model.device), valid, chunk_size, reserve)
    return Prefix(state, n_prefix, time.perf_counter() - t0)


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
    """Feeds one token per row according to the method; owns the relevance state [B, n_keys]."""

    def __init__(self, backend, config: DecodingConfig, rows: Rows, span_mass: Sequence[SpanMass | None] | None = None):
        self.backend, self.config, self.rows = backend, config, rows
        self.uses_heads = config.uses_heads
        # on the device once, with room for every generated key (never excluded): each step slices it
        never = rows.never_selected(config.template_masking)
        self.excluded = extend_mask(never, rows.width + config.max_new_tokens + 1).to(backend.model.device)
        self.span_mass = span_mass
        self.relevance: torch.Tensor | None = None
        self.static: relevance.Selection | None = None

    def _update(self, attention: torch.Tensor) -> None:
        self.relevance = relevance.update_relevance(attention, self.relevance, self.config.decay)

    def select(self, n_keys: int) -> relevance.Selection:
        """Nucleus-then-K selection; prompt template tokens and pads are never selected."""
        return relevance.select_keys(self.relevance, self.config.top_p, self.config.top_k, self.excluded[:, :n_keys])

    def _records(self, phase: str, n_cached: int, tokens: torch.Tensor, selection) -> list[StepRecord]:
        pads = self.rows.pads
        tokens = tokens.tolist()
        records = [StepRecord(phase, n_cached - pad, tok) for pad, tok in zip(pads, tokens)]
        if selection is not None:
            counts, masses = selection.count.tolist(), selection.mass.tolist()
            for i, rec in enumerate(records):
                rec.n_selected, rec.nucleus_mass = int(counts[i]), round(float(masses[i]), 6)
                if self.config.record_positions:
                    rec.selected = (selection.mask[i].nonzero().flatten() - pads[i]).tolist()
        if self.span_mass is not None and self.relevance is not None:
            r = self.relevance.cpu()
            for i, rec in enumerate(records):
                if self.span_mass[i] is not None:
                    rec.top_spans = self.span_mass[i].top_spans(r[i, pads[i]:])
        return records

    def context_warmup(self, state: DecodeState, tokens: torch.Tensor) -> tuple[torch.Tensor, list[StepRecord]]:
        n_cached = state.n_keys
        logits, attention = self.backend.step(state, tokens, read=self.uses_heads)
        if attention is not None:
            self._update(attention)
        return logits, self._records("context-warmup", n_cached, tokens, None)

    def full_step(self, state: DecodeState, tokens: torch.Tensor, phase: str) -> tuple[torch.Tensor, list[StepRecord]]:
        n_cached = state.n_keys
        if not self.uses_heads:
            logits, _ = self.backend.step(state, tokens)
            return logits, self._records(phase, n_cached, tokens, None)
        n_keys = n_cached + 1
        if self.config.method == "dysco-reuse":
            chosen = []

            def select_bias(attention: torch.Tensor) -> torch.Tensor:
                self._update(attention)
                chosen.append(self.select(n_keys))
                return relevance.scaling_bias(chosen[0].mask, self.config.beta)

            logits = self.backend.reuse_step(state, tokens, select_bias)
            return logits, self._records(phase, n_cached, tokens, chosen[0])
        if self.config.method == "dysco-static":
            if self.static is None:
                if self.relevance is None:  # no context warm-up: select from this token's partial pass
                    self._update(self.backend.partial(state, tokens))
                self.static = self.select(self.relevance.shape[-1])
            selection = self.static
            mask = torch.nn.functional.pad(selection.mask, (0, n_keys - selection.mask.shape[-1]))
        else:
            self._update(self.backend.partial(state, tokens))
            selection = self.select(n_keys)
            mask = selection.mask
        logits, _ = self.backend.step(state, tokens, bias=relevance.scaling_bias(mask, self.config.beta))
        return logits, self._records(phase, n_cached, tokens, selection)


def _decode_rows(
    model: LoadedModel, rows: Rows, config: DecodingConfig, heads: HeadSet | None, prefix: Prefix,
    backend: str, spans: Sequence[Spans | None] | None,
) -> list[GenerationResult]:
    """One method on every row, from a copy of the prefix."""
    batch, width, n_gen = len(rows.prepared), rows.width, rows.n_gen
    heads = resolve_heads(model, heads, config)
    runner = make_backend(model, backend, heads, config.tau if config.method == "uniattns" else 1.0)
    if runner.max_batch is not None and batch > runner.max_batch:
        raise ConfigError(f"the {backend} backend decodes at most {runner.max_batch} prompt(s) at a time")
    span_mass = None
    if spans is not None:
        span_mass = [None if s is None else SpanMass(s, len(p.ids)) for s, p in zip(spans, rows.prepared)]
    stepper = _Stepper(runner, config, rows, span_mass)
    traces = [Trace(config.method, len(p.ids), list(heads) if heads is not None else []) for p in rows.prepared]
    sampler = Sampler(config.sampling, model.device)
    state = prefix.state.clone()
    ids = rows.ids.to(model.device)

    def keep(records, active):
        for trace, rec, on in zip(traces, records, active):
            if on:
                trace.steps.append(rec)

    everyone = [True] * batch
    t0 = time.perf_counter()
    logits = None
    for col in range(prefix.n_tokens, width - n_gen):
        logits, records = stepper.context_warmup(state, ids[:, col])
        keep(records, everyone)
    for col in range(max(prefix.n_tokens, width - n_gen), width):
        logits, records = stepper.full_step(state, ids[:, col], "intervention-warmup")
        keep(records, everyone)
    warm_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    outs: list[list[int]] = [[] for _ in range(batch)]
    finished = [False] * batch
    active = list(everyone)
    eos = model.eos_token_ids
    while True:
        tokens = sampler(logits)
        for i, tok in enumerate(tokens.tolist()):
            if active[i]:
                outs[i].append(tok)
                finished[i] = tok in eos
                active[i] = not finished[i] and len(outs[i]) < config.max_new_tokens
        if not any(active):
            break
        logits, records = stepper.full_step(state, tokens, "decode")  # finished rows idle along
        keep(records, active)
    decode_s = time.perf_counter() - t0

    results = []
    for i, p in enumerate(rows.prepared):
        timings = Timings(prefill_s=prefix.prefill_s, warmup_s=warm_s, decode_s=decode_s,
                          n_prompt=len(p.ids), n_new=len(outs[i]), batch_size=batch)
        text = model.tokenizer.decode(outs[i], skip_special_tokens=True)
        results.append(GenerationResult(text, outs[i], list(p.ids), finished[i], timings, trace=traces[i],
                                        method=config.method))
    return results


def _prepare_all(model, prompts, configs, prepared) -> dict:
    """Encoded prompts per enable_thinking setting the configs use."""
    by_thinking: dict = {}
    if prepared is not None:
        thinking = {c.enable_thinking for c in configs.values()}
        if len(thinking) != 1:
            raise ConfigError("prepared prompts serve configs with one enable_thinking setting")
        if len(prepared) != len(prompts):
            raise ConfigError(f"{len(prepared)} prepared prompts for {len(prompts)} prompts")
        by_thinking[thinking.pop()] = list(prepared)
    for config in configs.values():
        if config.enable_thinking not in by_thinking:
            by_thinking[config.enable_thinking] = [prepare_prompt(model, p, config.enable_thinking) for p in prompts]
    return by_thinking


def generate_batch(
    model: LoadedModel,
    prompts: Sequence[str | Messages],
    configs: Mapping[str, DecodingConfig],
    heads: HeadSet | None = None,
    spans: Sequence[Spans | None] | None = None,
    prepared: Sequence[PreparedPrompt] | None = None,
    backend: str = "bridge",
) -> dict[str, list[GenerationResult]]:
    """Several methods on several prompts decoded together; one result per prompt per method.

    Methods that keep prefill attention share one prefill. `backend`: "bridge" (TL hooks,
    one prompt), "sdpa" (fast; prompts of any lengths together, left-padded) or "static" (as
    sdpa, with fixed KV buffers and CUDA-graph steps on a GPU). Every row gets the tokens it
    would get alone, up to floating-point differences of the padded batch.
    """
    return dict(iter_methods(model, prompts, configs, heads, spans, prepared, backend))


def check_prompt(prompt, what: str = "prompt") -> None:
    """ConfigError unless `prompt` is non-empty text or a non-empty list of chat messages."""
    if prompt is None:
        raise ConfigError(f"{what} is None; pass the prompt text or a list of chat messages")
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError(f"{what} is empty")
        return
    if isinstance(prompt, EncodedPrompt):
        return  # prepare_prompt explains why it wants the text
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ConfigError(f"{what} must be text or a non-empty list of chat messages, got {typed(prompt)}")
    for i, message in enumerate(prompt):
        if not (isinstance(message, Mapping) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise ConfigError(f"{what}: message {i} must be a dict with string 'role' and 'content', "
                              f"got {typed(message)}")


def check_config(config, what: str = "config") -> None:
    if not isinstance(config, DecodingConfig):
        raise ConfigError(f"{what} must be a DecodingConfig (e.g. DecodingConfig(method='dysco') or "
                          f"preset('paper')), got {typed(config)}")


def check_configs(configs) -> None:
    """ConfigError unless `configs` maps names to DecodingConfig objects."""
    if not isinstance(configs, Mapping) or not configs:
        raise ConfigError(f"configs must be a non-empty mapping of name -> DecodingConfig, got {typed(configs)}")
    for name, config in configs.items():
        check_config(config, f"config {name!r}")


def check_heads(heads) -> None:
    """ConfigError unless `heads` is a HeadSet or None; a list of pairs is named as such."""
    if heads is not None and not isinstance(heads, HeadSet):
        raise ConfigError(
            f"heads must be a HeadSet, got {typed(heads)}: wrap (layer, head) pairs as HeadSet([...]), "
            "or read a head file with heads.load_heads(path)"
        )


def iter_methods(model, prompts, configs, heads=None, spans=None, prepared=None, backend="bridge"):
    """`generate_batch` one method at a time: yields (name, results) as each method finishes."""
    check_backend(backend)
    check_configs(configs)
    check_heads(heads)
    if isinstance(prompts, (str, Mapping)) or prompts is None:
        raise ConfigError(f"prompts must be a list of prompts, got {typed(prompts)}; for one prompt use "
                          "dysco_generate or compare_methods")
    prompts = list(prompts)
    if not prompts:
        raise ConfigError("no prompts to decode")
    for i, prompt in enumerate(prompts):
        check_prompt(prompt, "prompt" if len(prompts) == 1 else f"prompt #{i}")
    if spans is not None and len(spans) != len(prompts):
        raise ConfigError(f"{len(spans)} span sets for {len(prompts)} prompts")
    by_thinking = _prepare_all(model, prompts, configs, prepared)
    rows_by_thinking = {t: Rows.of(p, _pad_id(model)) for t, p in by_thinking.items()}
    for rows in rows_by_thinking.values():
        for config in configs.values():
            model.check_fits(rows.width, config.max_new_tokens)
    shared: dict[tuple, Prefix] = {}
    for name, config in configs.items():
        rows = rows_by_thinking[config.enable_thinking]
        if config.changes_prefill:
            prefix = prefill_prefix(model, rows, config, backend)
        else:
            key = (config.enable_thinking, config.warmup)
            if key not in shared:
                shared[key] = prefill_prefix(model, rows, config, backend)
            prefix = shared[key]
        yield name, _decode_rows(model, rows, config, heads, prefix, backend, spans)


def _pad_id(model: LoadedModel) -> int:
    tok = model.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return int(pad if pad is not None else 0)


def compare_methods(
    model: LoadedModel,
    prompt: str | Messages,
    configs: Mapping[str, DecodingConfig],
    heads: HeadSet | None = None,
    spans: Spans | None = None,
    prepared: PreparedPrompt | None = None,
    backend: str = "bridge",
) -> dict[str, GenerationResult]:
    """Several methods on one prompt, prefilling once for all that keep prefill attention.

    `prepared`: the prompt already encoded with the configs' (one) `enable_thinking`.
    """
    out = generate_batch(model, [prompt], configs, heads, None if spans is None else [spans],
                         None if prepared is None else [prepared], backend)
    return {name: results[0] for name, results in out.items()}


def dysco_generate(
    model: LoadedModel,
    prompt: str | Messages,
    heads: HeadSet | None = None,
    config: DecodingConfig = DecodingConfig(),
    spans: Spans | None = None,
    prepared: PreparedPrompt | None = None,
    backend: str = "bridge",
) -> GenerationResult:
    """Generate with one method; returns text, tokens and a per-step `Trace`.

    `heads`: the QRHeads (H*) for the dysco methods. `spans`: named token spans of the
    prompt (edges, documents) whose relevance mass the trace reports. `backend`: "bridge"
    (TransformerLens hooks), "sdpa" (fast, same tokens) or "static" (fastest on a GPU, same tokens).
    Wrong argument types (a list of pairs for `heads`, a string or None for `config`, an empty
    prompt) are ConfigErrors that say what to pass instead.
    """
    check_config(config)
    return compare_methods(model, prompt, {config.method: config}, heads, spans, prepared, backend)[config.method]
