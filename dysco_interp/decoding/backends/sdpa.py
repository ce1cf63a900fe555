"""The "sdpa" backend: the model's SDPA twin (same weight tensors) with DySCO in its attention.

An attention function registered with transformers adds the bias to SDPA's additive mask and
computes the QRHeads' rows from q.K of those heads only, so decoding stays on fused kernels.
Rows of different lengths decode together, left-padded. `AttentionControl`, passed as a
forward keyword, says what the function does in one pass. The "static" backend prefills
through the same function (`prefill_into`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from dysco_interp.decoding import relevance, runtime
from dysco_interp.decoding.backends.base import Backend, DecodeState, SelectBias, StepOutput, StopForward, stop_after
from dysco_interp.decoding.interventions import RelevanceReader
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import Hook
from dysco_interp.models import LoadedModel, share_weights_twin

ATTN_IMPLEMENTATION = "dysco_sdpa"


@dataclass
class AttentionControl:
    """What the attention function does in one forward pass."""

    tau: float = 1.0
    read: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> query heads to read
    bias: torch.Tensor | None = None  # float32 [B, 1, 1, n_keys]
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> read rows, float32 [B, h, n]
    bias_after: int | None = None  # with then_bias: the layer after whose attention the bias starts
    then_bias: Callable[[], torch.Tensor] | None = None  # the bias of the layers after `bias_after`


def last_query_rows(query, key, mask, heads: torch.Tensor, scale: float, groups: int) -> torch.Tensor:
    """Softmax attention row of the last query for the chosen heads only, float32 [B, h, n]."""
    q = query[:, heads, -1, :].float()
    k = key[:, torch.div(heads, groups, rounding_mode="floor")].float()
    scores = torch.einsum("bhd,bhnd->bhn", q, k) * scale
    if mask is not None:
        last = mask[:, :, -1, :]
        scores = scores.masked_fill(~last, -math.inf) if last.dtype == torch.bool else scores + last.float()
    return scores.softmax(dim=-1)


def biased_mask(mask, bias: torch.Tensor, query: torch.Tensor, n_visible: int) -> torch.Tensor:
    """SDPA's mask with the bias added on the keys this layer sees (the last n_visible)."""
    bias = relevance.window_slice(bias, n_visible).to(device=query.device, dtype=query.dtype)
    if mask is not None:
        bias = torch.where(mask, bias, torch.finfo(query.dtype).min) if mask.dtype == torch.bool else mask + bias
    # an 8-aligned row stride keeps SDPA on its fused kernels for any key count
    width = bias.shape[-1]
    return torch.nn.functional.pad(bias, (0, -width % 8))[..., :width]


def biased_decode_attention(query, key, value, mask, bias, scale: float, groups: int):
    """One decoding query with the bias: the query heads of each KV head form the query rows
    of one SDPA call, so keys and values are never repeated per query head."""
    if query.shape[2] != 1:
        raise ValueError("the attention bias is applied one decoding token at a time")
    batch, n_heads, _, dim = query.shape
    mask = biased_mask(mask, bias, query, key.shape[-2])
    packed = query.reshape(batch, n_heads // groups, groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scale)
    return out.reshape(batch, n_heads, 1, -1).transpose(1, 2).contiguous(), None


def dysco_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                    dysco_control: AttentionControl | None = None, **kwargs):
    """SDPA attention with DySCO's reads, bias and temperature; plain SDPA without a control."""
    ctl = dysco_control
    if ctl is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = (scaling if scaling is not None else query.shape[-1] ** -0.5) / ctl.tau
    groups = getattr(module, "num_key_value_groups", 1)
    heads = ctl.read.get(module.layer_idx)
    if heads is not None:
        ctl.rows[module.layer_idx] = last_query_rows(query, key, attention_mask, heads, scale, groups)
    if ctl.bias is not None:
        return biased_decode_attention(query, key, value, attention_mask, ctl.bias, scale, groups)
    out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scale, **kwargs)
    if ctl.then_bias is not None and module.layer_idx == ctl.bias_after:
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


def read_heads(model: LoadedModel, heads: HeadSet | None) -> dict[int, torch.Tensor]:
    """layer -> the QRHeads of that layer, on that layer's device (validated against the model)."""
    if heads is None:
        return {}
    reader = RelevanceReader(heads, model.spec)
    return {layer: torch.tensor(hs, device=model.layout.layer_device(layer))
            for layer, hs in reader.heads_by_layer.items()}


def forward(hf: torch.nn.Module, state: DecodeState, ids: torch.Tensor, ctl: AttentionControl, cache: Cache,
            positions: torch.Tensor | None = None, new_valid: torch.Tensor | None = None):
    """`ids` after the state's keys, through `hf`; new tokens are real unless `new_valid` says
    otherwise (the prompt's left pads)."""
    kwargs = {}
    if state.valid is not None:
        n = ids.shape[1]
        if new_valid is None:
            new_valid = torch.ones(ids.shape[0], n, dtype=torch.bool, device=ids.device)
        kwargs["attention_mask"] = torch.cat([state.valid, new_valid], dim=1)
        if positions is None:
            assert state.next_position is not None
            positions = state.next_position[:, None] + torch.arange(n, device=ids.device)
        kwargs["position_ids"] = positions
    return hf(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1, dysco_control=ctl, **kwargs)


@torch.inference_mode()
def prefill_into(hf: torch.nn.Module, model: LoadedModel, state: DecodeState, ids: torch.Tensor,
                 valid: torch.Tensor | None, chunk_size: int, tau: float) -> DecodeState:
    """The prompt, chunked, into an empty state; left pads sit at position 0 and each row
    counts from 0 at its first real token."""
    ids = ids.to(model.device)
    runtime.check_chunk_size(chunk_size)
    model.check_fits(ids.shape[1])
    positions = None
    if valid is not None:
        valid = valid.to(model.device)
        state.valid = valid[:, :0]
        positions = (valid.long().cumsum(-1) - 1).clamp_min(0)
    for start in range(0, ids.shape[1], chunk_size):
        window = slice(start, start + chunk_size)
        chunk = ids[:, window]
        if valid is None or positions is None:
            forward(hf, state, chunk, AttentionControl(tau=tau), state.cache)
        else:
            forward(hf, state, chunk, AttentionControl(tau=tau), state.cache, positions[:, window], valid[:, window])
        state.n_keys += chunk.shape[1]
        if valid is not None:
            state.valid = valid[:, : state.n_keys]
    if positions is not None:
        state.next_position = positions[:, -1] + 1
    return state


def decoder_layers(hf: torch.nn.Module) -> torch.nn.ModuleList:
    return hf.model.layers


class SdpaBackend(Backend):
    """The SDPA twin; rows of different lengths decode together (left padding)."""

    name = "sdpa"
    max_batch = None

    def __init__(self, model: LoadedModel, heads: HeadSet | None, *, tau: float = 1.0, graphs: bool | None = None,
                 hooks: Sequence[Hook] = ()):
        super().__init__(model, heads, tau=tau, graphs=graphs, hooks=hooks)
        self.hf = twin(model, ATTN_IMPLEMENTATION)
        self.read = read_heads(model, heads)
        self.max_layer = max(self.read) if self.read else None

    def attention(self, rows: dict[int, torch.Tensor], n_keys: int) -> torch.Tensor:
        return relevance.aggregate_heads([rows[layer] for layer in sorted(rows)], n_keys, device=self.model.device)

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor | None, *, chunk_size: int | None = None,
                reserve: int = 0) -> DecodeState:
        return prefill_into(self.hf, self.model, DecodeState(runtime.new_cache(self.model), 0), ids, valid,
                            runtime.chunk_or_default(chunk_size), self.tau)

    def _decode(self, state: DecodeState, tokens: torch.Tensor, ctl: AttentionControl) -> torch.Tensor:
        self.model.check_fits(state.n_keys + 1)
        out = forward(self.hf, state, tokens.to(self.model.device)[:, None], ctl, state.cache)
        state.advance()
        return out.logits[:, -1].float().to(self.model.device)

    @torch.inference_mode()
    def step(self, state: DecodeState, tokens: torch.Tensor, *, bias: torch.Tensor | None = None,
             read: bool = False) -> StepOutput:
        self.check_step(bias, read)
        if read:
            self.needs_heads()
        ctl = AttentionControl(tau=self.tau, read=self.read if read else {}, bias=bias)
        logits = self._decode(state, tokens, ctl)
        return StepOutput(logits, self.attention(ctl.rows, state.n_keys) if read else None)

    @torch.inference_mode()
    def partial(self, state: DecodeState, tokens: torch.Tensor) -> StepOutput:
        self.needs_heads()
        ctl = AttentionControl(tau=self.tau, read=self.read)
        try:
            with stop_after(decoder_layers(self.hf)[self.max_layer]):
                forward(self.hf, state, tokens.to(self.model.device)[:, None], ctl, runtime.FrozenCache(state.cache))
        except StopForward:
            return StepOutput(attention=self.attention(ctl.rows, state.n_keys + 1))
        raise RuntimeError("the partial pass did not reach the deepest QRHead layer")

    @torch.inference_mode()
    def reuse_step(self, state: DecodeState, tokens: torch.Tensor, select_bias: SelectBias) -> StepOutput:
        self.needs_heads()
        ctl = AttentionControl(tau=self.tau, read=self.read, bias_after=self.max_layer)
        n_keys = state.n_keys + 1
        attention: torch.Tensor | None = None

        def then_bias() -> torch.Tensor:
            nonlocal attention
            attention = self.attention(ctl.rows, n_keys)  # read once, after layer L*
            return select_bias(attention)

        ctl.then_bias = then_bias
        logits = self._decode(state, tokens, ctl)
        return StepOutput(logits, attention)
