"""Where a decoding step runs: the TransformerLens bridge (hooks) or plain HF SDPA (fast, batched);
`static.py` adds fixed KV buffers and CUDA graphs on top of the SDPA one.

The decode loop (`dysco.py`) needs three things on a prefilled `DecodeState`:
- `step(state, tokens, bias=None, read=False)`: one token per row, cache written; the
  float32 logits and, with `read`, the QRHeads' attention aggregated on key positions;
- `partial(state, tokens)`: layers 0..max QRHead layer, no bias, no key kept (the static
  backend writes the step's slot, which the full step rewrites); the QRHeads' aggregated attention;
- `reuse_step(state, tokens, select_bias)`: one pass that writes the cache; after the
  deepest QRHead layer L*, `select_bias(attention)` turns that layer's read into the bias
  of layers L*+1.. (the "dysco-reuse" method); returns the logits;
- `prefill(ids, valid, chunk_size, reserve)`: the prompt into a fresh state, UniAttnS's
  temperature included; `reserve` tokens will be decoded after it (fixed buffers are sized by it).
The bias is `relevance.scaling_bias` on absolute key positions, float32 `[B, 1, 1, n_keys]`.

"bridge" runs everything through the TransformerBridge with the hooks in
`interventions.py` (eager attention; batch 1): the reference, and what analyses hook into.
"sdpa" runs the SDPA twin (same weight tensors) with an attention function that adds the
bias to SDPA's mask and computes the QRHeads' rows from q.K of those heads only; it
batches rows of different lengths (left padding). The relevance and selection math is
shared; only these two operations differ.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from dysco_interp.decoding import relevance, runtime
from dysco_interp.decoding.interventions import AttentionTemperature, BiasWriter, RelevanceReader
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel, share_weights_twin

BACKENDS = ("bridge", "sdpa", "static")
ATTN_IMPLEMENTATION = "dysco_sdpa"


@dataclass
class DecodeState:
    """A cache plus what rows of different lengths need: which keys are real, and positions."""

    cache: Cache
    n_keys: int  # cached tokens per row (left-padded rows count their pads)
    valid: torch.Tensor | None = None  # bool [B, n_keys]: False at left pads; None: no pads
    next_position: torch.Tensor | None = None  # long [B]: position id of each row's next token

    def advance(self, n: int = 1) -> None:
        self.n_keys += n
        if self.valid is not None:
            self.valid = torch.nn.functional.pad(self.valid, (0, n), value=True)
            self.next_position = self.next_position + n

    def clone(self) -> "DecodeState":
        return DecodeState(runtime.clone_cache(self.cache), self.n_keys,
                           None if self.valid is None else self.valid.clone(),
                           None if self.next_position is None else self.next_position.clone())


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return name


def make_backend(model: LoadedModel, name: str, heads: HeadSet | None, tau: float = 1.0):
    check_backend(name)
    if name == "static":
        from dysco_interp.decoding.static import StaticBackend

        return StaticBackend(model, heads, tau)
    return (BridgeBackend if name == "bridge" else SdpaBackend)(model, heads, tau)


class BridgeBackend:
    """The TransformerBridge with plain TL hooks (eager attention), one row at a time."""

    name = "bridge"
    max_batch = 1

    def __init__(self, model: LoadedModel, heads: HeadSet | None, tau: float = 1.0):
        self.model = model
        self.reader = RelevanceReader(heads, model.spec) if heads is not None else None
        self.writer = BiasWriter(model.spec)
        self.temperature = AttentionTemperature(model.spec, tau).hooks() if tau != 1.0 else []

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor | None, chunk_size: int = runtime.DEFAULT_CHUNK,
                reserve: int = 0) -> DecodeState:
        if ids.shape[0] != 1 or valid is not None:
            raise ConfigError("the bridge backend decodes one prompt at a time; use backend='sdpa' or 'static' for batches")
        cache, _ = runtime.prefill(self.model, ids, chunk_size=chunk_size, hooks=self.temperature)
        return DecodeState(cache, ids.shape[1])

    def step(self, state: DecodeState, tokens: torch.Tensor, bias=None, read: bool = False):
        hooks = list(self.temperature)
        if read:
            self.reader.set_length(state.n_keys + 1)
            hooks += self.reader.hooks()
        if bias is not None:
            self.writer.set_bias(bias)
            hooks += self.writer.hooks()
        logits = runtime.step(self.model, state.cache, tokens[:, None], hooks)
        state.advance()
        return logits, (self.reader.attention() if read else None)

    def partial(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        self.reader.set_length(state.n_keys + 1)
        runtime.partial_step(self.model, state.cache, tokens[:, None], self.reader.max_layer + 1, self.reader.hooks())
        return self.reader.attention()

    def reuse_step(self, state: DecodeState, tokens: torch.Tensor, select_bias):
        after = self.reader.max_layer + 1
        n_layers = self.model.spec.n_layers
        self.reader.set_length(state.n_keys + 1)
        writer = BiasWriter(self.model.spec, layers=range(after, n_layers))

        def trigger(resid, hook):
            writer.set_bias(select_bias(self.reader.attention()))

        hooks = list(self.temperature) + self.reader.hooks() + writer.hooks()
        if after < n_layers:
            hooks.append((f"blocks.{after}.hook_in", trigger))
        logits = runtime.step(self.model, state.cache, tokens[:, None], hooks)
        if after == n_layers:  # the deepest QRHead is in the last layer: nothing left to bias
            select_bias(self.reader.attention())
        state.advance()
        return logits


# --------------------------------------------------------------------------- sdpa


@dataclass
class _Control:
    """What the attention function does in one forward pass (passed as a forward kwarg)."""

    tau: float = 1.0
    read: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> query heads to read
    stop_at: int | None = None  # raise _PartialDone after reading this layer
    bias: torch.Tensor | None = None  # float32 [B, 1, 1, n_keys]
    rows: dict[int, torch.Tensor] = field(default_factory=dict)
    then_bias: Callable[[], torch.Tensor] | None = None  # after layer stop_at's attention: later layers' bias


class _PartialDone(Exception):
    """Ends a partial pass right after the deepest QRHead layer has been read."""


def _last_row(query, key, mask, heads: torch.Tensor, scale: float, groups: int) -> torch.Tensor:
    """Softmax attention row of the last query for the chosen heads only, float32 [B, h, n]."""
    q = query[:, heads, -1, :].float()
    k = key[:, torch.div(heads, groups, rounding_mode="floor")].float()
    scores = torch.einsum("bhd,bhnd->bhn", q, k) * scale
    if mask is not None:
        last = mask[:, :, -1, :]
        scores = scores.masked_fill(~last, -math.inf) if last.dtype == torch.bool else scores + last.float()
    return scores.softmax(dim=-1)


def _biased_mask(mask, bias: torch.Tensor, query: torch.Tensor, n_visible: int) -> torch.Tensor:
    """SDPA's mask with the bias added on the keys this layer sees (the last n_visible)."""
    bias = relevance.window_slice(bias, n_visible).to(device=query.device, dtype=query.dtype)
    if mask is not None:
        bias = torch.where(mask, bias, torch.finfo(query.dtype).min) if mask.dtype == torch.bool else mask + bias
    # an 8-aligned row stride keeps SDPA on its fused kernels for any key count
    width = bias.shape[-1]
    return torch.nn.functional.pad(bias, (0, -width % 8))[..., :width]


def _biased_decode_attention(query, key, value, mask, bias, scale: float, groups: int):
    """One decoding query with the bias: the query heads of each KV head form the query rows
    of one SDPA call, so keys and values are never repeated per query head."""
    if query.shape[2] != 1:
        raise ValueError("the attention bias is applied one decoding token at a time")
    batch, n_heads, _, dim = query.shape
    mask = _biased_mask(mask, bias, query, key.shape[-2])
    packed = query.reshape(batch, n_heads // groups, groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scale)
    return out.reshape(batch, n_heads, 1, -1).transpose(1, 2).contiguous(), None


def dysco_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                    dysco_control: _Control | None = None, **kwargs):
    """SDPA attention with DySCO's reads, bias and temperature; plain SDPA without a control."""
    ctl = dysco_control
    if ctl is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    scale = (scaling if scaling is not None else query.shape[-1] ** -0.5) / ctl.tau
    groups = getattr(module, "num_key_value_groups", 1)
    heads = ctl.read.get(module.layer_idx)
    if heads is not None:
        ctl.rows[module.layer_idx] = _last_row(query, key, attention_mask, heads, scale, groups)
        if module.layer_idx == ctl.stop_at and ctl.then_bias is None:
            raise _PartialDone
    if ctl.bias is not None:
        return _biased_decode_attention(query, key, value, attention_mask, ctl.bias, scale, groups)
    out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scale, **kwargs)
    if ctl.then_bias is not None and module.layer_idx == ctl.stop_at:
        ctl.bias = ctl.then_bias()
    return out


AttentionInterface.register(ATTN_IMPLEMENTATION, dysco_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


_TWINS: "weakref.WeakKeyDictionary[torch.nn.Module, dict[str, torch.nn.Module]]" = weakref.WeakKeyDictionary()


def twin(model: LoadedModel, implementation: str) -> torch.nn.Module:
    """Another view of the model's weights whose attention is a DySCO function; made once per
    model and function, so the SDPA twin that prefill uses stays exactly as loaded."""
    hf = model.prefill_model
    twins = _TWINS.setdefault(hf, {})
    if implementation not in twins:
        twins[implementation] = share_weights_twin(hf, implementation)
    return twins[implementation]


class SdpaBackend:
    """The SDPA twin; rows of different lengths decode together (left padding)."""

    name = "sdpa"
    max_batch = None
    implementation = ATTN_IMPLEMENTATION

    def __init__(self, model: LoadedModel, heads: HeadSet | None, tau: float = 1.0):
        self.model = model
        self.hf = twin(model, self.implementation)
        self.tau = float(tau)
        self.read: dict[int, torch.Tensor] = {}
        if heads is not None:
            reader = RelevanceReader(heads, model.spec)  # validates the heads against the model
            self.read = {layer: torch.tensor(hs, device=model.device) for layer, hs in reader.heads_by_layer.items()}
        self.max_layer = max(self.read) if self.read else None

    def _forward(self, state: DecodeState, ids: torch.Tensor, ctl: _Control, cache: Cache,
                 positions=None, new_valid=None):
        """New tokens are real unless `new_valid` says otherwise (the prompt's left pads)."""
        kwargs = {}
        if state.valid is not None:
            n = ids.shape[1]
            if new_valid is None:
                new_valid = torch.ones(ids.shape[0], n, dtype=torch.bool, device=ids.device)
            kwargs["attention_mask"] = torch.cat([state.valid, new_valid], dim=1)
            if positions is None:
                positions = state.next_position[:, None] + torch.arange(n, device=ids.device)
            kwargs["position_ids"] = positions
        return self.hf(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1,
                       dysco_control=ctl, **kwargs)

    def _attention(self, rows: dict[int, torch.Tensor], n_keys: int) -> torch.Tensor:
        layers = sorted(rows)
        return relevance.aggregate_heads([rows[layer] for layer in layers], n_keys)

    def _empty_state(self, n_tokens: int) -> DecodeState:
        return DecodeState(runtime.new_cache(self.model), 0)

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, valid: torch.Tensor | None, chunk_size: int = runtime.DEFAULT_CHUNK,
                reserve: int = 0) -> DecodeState:
        """`reserve`: tokens to be decoded after the prompt (backends with fixed buffers size them by it)."""
        ids = ids.to(self.model.device)
        self.model.check_fits(ids.shape[1])
        state = self._empty_state(ids.shape[1] + reserve)
        positions = None
        if valid is not None:
            valid = valid.to(self.model.device)
            state.valid = valid[:, :0]
            # pads sit at position 0; each row counts from 0 at its first real token
            positions = (valid.long().cumsum(-1) - 1).clamp_min(0)
        for start in range(0, ids.shape[1], chunk_size):
            chunk = ids[:, start : start + chunk_size]
            window = slice(start, start + chunk_size)
            if valid is None:
                self._forward(state, chunk, _Control(tau=self.tau), state.cache)
            else:
                self._forward(state, chunk, _Control(tau=self.tau), state.cache, positions[:, window], valid[:, window])
            state.n_keys += chunk.shape[1]
            if valid is not None:
                state.valid = valid[:, : state.n_keys]
        if valid is not None:
            state.next_position = positions[:, -1] + 1
        return state

    @torch.inference_mode()
    def step(self, state: DecodeState, tokens: torch.Tensor, bias=None, read: bool = False):
        ctl = _Control(tau=self.tau, read=self.read if read else {}, bias=bias)
        self.model.check_fits(state.n_keys + 1)
        logits = self._forward(state, tokens.to(self.model.device)[:, None], ctl, state.cache).logits[:, -1].float()
        state.advance()
        return logits, (self._attention(ctl.rows, state.n_keys) if read else None)

    @torch.inference_mode()
    def partial(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        ctl = _Control(tau=self.tau, read=self.read, stop_at=self.max_layer)
        try:
            self._forward(state, tokens.to(self.model.device)[:, None], ctl, runtime.FrozenCache(state.cache))
        except _PartialDone:
            pass
        else:
            raise RuntimeError("the partial pass did not reach the deepest QRHead layer")
        return self._attention(ctl.rows, state.n_keys + 1)

    @torch.inference_mode()
    def reuse_step(self, state: DecodeState, tokens: torch.Tensor, select_bias):
        ctl = _Control(tau=self.tau, read=self.read, stop_at=self.max_layer)
        ctl.then_bias = lambda: select_bias(self._attention(ctl.rows, state.n_keys + 1))
        self.model.check_fits(state.n_keys + 1)
        logits = self._forward(state, tokens.to(self.model.device)[:, None], ctl, state.cache).logits[:, -1].float()
        state.advance()
        return logits
