"""The "sdpa" backend: the model's SDPA twin (same weight tensors) with DySCO in its attention.

An attention function registered with transformers adds the bias to SDPA's additive mask and
computes the QRHeads' rows from q.K of those heads only, so decoding stays on fused kernels.
Rows of different lengths decode together, left-padded. `AttentionControl`, passed as a
forward keyword, is a pass plan as the attention function needs it. The "static" backend
prefills through the same function (`prefill_into`).
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
from dysco_interp.decoding.backends.base import Backend, DecodeState, StepOutput, StopForward, head_masks, stop_after
from dysco_interp.decoding.backends.decode_attention import gather_kept
from dysco_interp.decoding.logit_scale import logn_of, scaled
from dysco_interp.decoding.plan import PassPlan, Scale
from dysco_interp.decoding.readout import read_outs
from dysco_interp.hooks import Hook
from dysco_interp.models import LoadedModel, share_weights_twin

ATTN_IMPLEMENTATION = "dysco_sdpa"


@dataclass
class AttentionControl:
    """What the attention function does in one forward pass."""

    scale: Scale | None = None  # the pass's logit scale
    scale_heads: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> `base.head_masks` of the scale
    logn: torch.Tensor | None = None  # float32 [B, 1, s, 1]: the log-n factor of each query
    read: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> query heads to read
    bias: torch.Tensor | None = None  # float32 [B, 1 or heads, 1, n_keys]: bias and mask together
    bias_layers: frozenset[int] = frozenset()  # the layers the bias applies to
    bias_heads: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> its biased heads (absent: all)
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> read rows, float32 [B, h, n]
    rule: Callable[[], torch.Tensor] | None = None  # builds the bias at the first biased layer
    keep: tuple[torch.Tensor, torch.Tensor] | None = None  # the plan's kept keys: positions, valid [B, C]
    keep_layers: frozenset[int] = frozenset()  # the layers that attend to the kept keys only
    n_keys: int = 0  # the keys of the pass, the token's own included (where a keep's positions point)


def last_query_rows(query, key, mask, heads: torch.Tensor, scale: float, groups: int,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention row of the last query for the chosen heads only, float32 [B, h, n];
    `bias` (float32, broadcastable to [B, h, n]) is the pass's bias on those heads, if any."""
    q = query[:, heads, -1, :].float()
    k = key[:, torch.div(heads, groups, rounding_mode="floor")].float()
    scores = torch.einsum("bhd,bhnd->bhn", q, k) * scale
    if mask is not None:
        last = mask[:, :, -1, :]
        scores = scores.masked_fill(~last, -math.inf) if last.dtype == torch.bool else scores + last.float()
    if bias is not None:
        scores = scores + bias
    return scores.softmax(dim=-1)


def read_bias(bias: torch.Tensor, n_visible: int, heads: torch.Tensor, biased: torch.Tensor | None) -> torch.Tensor:
    """The bias the read heads `heads` see, float32 [B, h or 1, n_visible]: all of it (each head's
    own row of a per-head bias), or only on those among the `biased` heads."""
    visible = relevance.window_slice(bias, n_visible)[:, :, 0].float().to(heads.device)
    if visible.shape[1] > 1:
        visible = visible[:, heads]
    if biased is None:
        return visible
    # where, not a product: a mask's -inf times 0 would be NaN
    return torch.where(torch.isin(heads, biased.to(heads.device))[None, :, None], visible, 0.0)


def aligned(mask: torch.Tensor) -> torch.Tensor:
    """The same values with an 8-aligned row stride, which keeps SDPA on its fused kernels for any key count."""
    width = mask.shape[-1]
    return torch.nn.functional.pad(mask, (0, -width % 8))[..., :width]


def biased_mask(mask, bias: torch.Tensor, query: torch.Tensor, n_visible: int) -> torch.Tensor:
    """SDPA's mask with the bias added on the keys this layer sees (the last n_visible)."""
    bias = relevance.window_slice(bias, n_visible).to(device=query.device, dtype=query.dtype)
    if mask is not None:
        bias = torch.where(mask, bias, torch.finfo(query.dtype).min) if mask.dtype == torch.bool else mask + bias
    return aligned(bias)


def biased_decode_attention(query, key, value, mask, bias, scale: float, groups: int,
                            heads: torch.Tensor | None = None):
    """One decoding query with the bias (on the query heads `heads` only, if given): the query
    heads of each KV head form the query rows of one SDPA call, so keys and values are never
    repeated per query head."""
    if query.shape[2] != 1:
        raise ValueError("the attention bias is applied one decoding token at a time")
    batch, n_heads, _, dim = query.shape
    full = biased_mask(mask, bias, query, key.shape[-2])
    if full.shape[1] > 1:  # a per-head bias: each KV head's query rows get their own heads' rows
        full = aligned(full.reshape(batch, n_heads // groups, groups, full.shape[-1]))
    if heads is not None:
        plain = biased_mask(mask, torch.zeros_like(bias[:, :1]), query, key.shape[-2])
        chosen = torch.zeros(n_heads, dtype=torch.bool, device=query.device)
        chosen[heads.to(query.device)] = True
        full = aligned(torch.where(chosen.view(1, n_heads // groups, groups, 1), full, plain))
    packed = query.reshape(batch, n_heads // groups, groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=full, scale=scale)
    return out.reshape(batch, n_heads, 1, -1).transpose(1, 2).contiguous(), None


def kept_decode_attention(query, key, value, mask, ctl: AttentionControl, layer: int, scale: float,
                          groups: int):
    """One decoding query over the plan's kept keys only (`plan.Keep`): their keys and values
    gathered (`decode_attention.gather_kept`), the model's mask and the pass's bias at their
    positions, so the layer reads a capacity of keys, not the cache."""
    assert ctl.keep is not None
    positions, valid = (t.to(key.device) for t in ctl.keep)
    n_visible = key.shape[-2]
    local = positions - (ctl.n_keys - n_visible)  # a sliding layer's cache holds its last keys only
    valid = valid & (local >= 0)
    local = local.clamp_min(0)
    hidden = torch.zeros(valid.shape, device=key.device).masked_fill_(~valid, -math.inf)[:, None, None, :]
    if mask is None:
        last = torch.zeros(1, 1, 1, n_visible, device=key.device)
    else:
        last = mask[:, :, -1:, :]
        last = torch.zeros(last.shape, device=key.device).masked_fill_(~last, -math.inf) \
            if last.dtype == torch.bool else last.float()
    key, value, kept = gather_kept(key, value, last, local, hidden)
    bias, heads = torch.zeros(1, 1, 1, local.shape[-1], device=key.device), None
    if layer in ctl.bias_layers and ctl.bias is not None:
        full = relevance.window_slice(ctl.bias, n_visible).to(key.device)
        full = full.expand(local.shape[0], *full.shape[1:])
        bias = full.gather(-1, local[:, None, None, :].expand(local.shape[0], full.shape[1], 1, local.shape[-1]))
        heads = ctl.bias_heads.get(layer)
    return biased_decode_attention(query, key, value, kept.to(query.dtype), bias, scale, groups, heads)


def dysco_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                    dysco_control: AttentionControl | None = None, **kwargs):
    """SDPA attention with a pass's reads, bias and scale; plain SDPA without a control."""
    ctl = dysco_control
    if ctl is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    layer = module.layer_idx
    query, scale = scaled(query, scaling if scaling is not None else query.shape[-1] ** -0.5, ctl.scale, layer,
                          ctl.scale_heads.get(layer), ctl.logn)
    biased = layer in ctl.bias_layers
    if biased and ctl.bias is None and ctl.rule is not None:
        ctl.bias = ctl.rule()
    heads = ctl.read.get(layer)
    if heads is not None:  # a read in a biased layer sees the attention as the pass uses it; in a kept one, every key
        bias = read_bias(ctl.bias, key.shape[-2], heads, ctl.bias_heads.get(layer)) \
            if biased and ctl.bias is not None else None
        ctl.rows[layer] = last_query_rows(query, key, attention_mask, heads, scale, groups, bias)
    if layer in ctl.keep_layers and ctl.keep is not None and query.shape[2] == 1:
        return kept_decode_attention(query, key, value, attention_mask, ctl, layer, scale, groups)
    if biased:
        assert ctl.bias is not None
        return biased_decode_attention(query, key, value, attention_mask, ctl.bias, scale, groups,
                                       ctl.bias_heads.get(layer))
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scale, **kwargs)


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


def read_heads(model: LoadedModel, plan: PassPlan) -> dict[int, torch.Tensor]:
    """layer -> the query heads the plan reads there, on that layer's device."""
    return {layer: torch.tensor(hs, device=model.layout.layer_device(layer)) for layer, hs in plan.read_heads().items()}


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
                 valid: torch.Tensor | None, chunk_size: int, scale: Scale | None = None) -> DecodeState:
    """The prompt, chunked, into an empty state, its attention under `scale`; left pads sit at
    position 0 and each row counts from 0 at its first real token."""
    ids = ids.to(model.device)
    runtime.check_chunk_size(chunk_size)
    model.check_fits(ids.shape[1])
    positions = None
    if valid is not None:
        valid = valid.to(model.device)
        state.valid = valid[:, :0]
        positions = (valid.long().cumsum(-1) - 1).clamp_min(0)
    heads = head_masks(scale, model.spec.n_heads, model.layout.layer_device)
    for start in range(0, ids.shape[1], chunk_size):
        window = slice(start, start + chunk_size)
        chunk = ids[:, window]
        at = torch.arange(start, start + chunk.shape[1], device=ids.device)[None] if positions is None \
            else positions[:, window]
        ctl = AttentionControl(scale=scale, scale_heads=heads, logn=logn_of(scale, at + 1))
        if valid is None or positions is None:
            forward(hf, state, chunk, ctl, state.cache)
        else:
            forward(hf, state, chunk, ctl, state.cache, positions[:, window], valid[:, window])
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
    runs_keep = True

    def __init__(self, model: LoadedModel, *, graphs: bool | None = None, hooks: Sequence[Hook] = (),
                 tau: float | None = None):
        super().__init__(model, graphs=graphs, hooks=hooks, tau=tau)
        self.hf = twin(model, ATTN_IMPLEMENTATION)
        self.decoder = self.hf  # the twin decoding passes run through (prefill always runs `hf`)
        # plan -> its reads, biased heads and scaled heads, on device
        self.controls: dict[PassPlan, tuple[dict, dict, dict]] = {}

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor | None, *, chunk_size: int | None = None,
                reserve: int = 0, scale: Scale | None = None) -> DecodeState:
        return prefill_into(self.hf, self.model, DecodeState(runtime.new_cache(self.model), 0), ids, valid,
                            runtime.chunk_or_default(chunk_size), self.prefill_scale(scale))

    def _control(self, plan: PassPlan, state: DecodeState) -> AttentionControl:
        additive = plan.additive
        if plan not in self.controls:
            heads = {}
            if additive is not None and additive.heads is not None:
                heads = {layer: torch.tensor(additive.heads_in(layer) or (), dtype=torch.long,
                                             device=self.model.layout.layer_device(layer))
                         for layer in additive.layers}
            self.controls[plan] = (read_heads(self.model, plan), heads,
                                   head_masks(plan.scale, self.model.spec.n_heads, self.model.layout.layer_device))
        read, bias_heads, scale_heads = self.controls[plan]
        logn = None
        if plan.scale is not None and plan.scale.log_n is not None:
            counts = state.next_position + 1 if state.next_position is not None \
                else torch.full((1,), state.n_keys + 1, device=self.model.device)
            logn = logn_of(plan.scale, counts[:, None])
        return AttentionControl(scale=plan.scale, scale_heads=scale_heads, logn=logn, read=read,
                                bias_heads=bias_heads,
                                bias_layers=frozenset(additive.layers) if additive is not None else frozenset(),
                                keep_layers=frozenset(plan.keep.layers) if plan.keep is not None else frozenset())

    @torch.inference_mode()
    def run(self, state: DecodeState, tokens: torch.Tensor, plan: PassPlan) -> StepOutput:
        plan = self.checked(plan)
        n_keys, batch = state.n_keys + 1, tokens.shape[0]
        self.model.check_fits(n_keys)
        ctl = self._control(plan, state)
        ctl.bias = self.given_bias(plan, batch, n_keys)
        ctl.keep, ctl.n_keys = self.given_keep(plan, batch, n_keys), n_keys
        if plan.bias is not None and ctl.bias is None:
            ctl.rule = lambda: self.ruled_bias(
                plan, read_outs(plan, ctl.rows, n_keys, self.model.device, first_only=True)[0], batch, n_keys)
        ids = tokens.to(self.model.device)[:, None]
        cache = state.cache if plan.write_cache else runtime.FrozenCache(state.cache)
        if plan.stop_after is None:
            out = forward(self.decoder, state, ids, ctl, cache)
            logits = out.logits[:, -1].float().to(self.model.device)
        else:
            try:
                with stop_after(decoder_layers(self.decoder)[plan.stop_after]):
                    forward(self.decoder, state, ids, ctl, cache)
            except StopForward:
                logits = None
            else:
                raise RuntimeError(f"the pass did not stop after layer {plan.stop_after}")
        if plan.write_cache:
            state.advance()
        return StepOutput(logits, read_outs(plan, ctl.rows, n_keys, self.model.device) if plan.reads else ())
