"""The decoder of Llama-family models (Llama, Qwen2, Qwen3) written out over the model's own weights.

The static backend's passes run here instead of through the transformers forward when the model
is of a family this file knows. At batch 1 a decoding step is bound by memory bandwidth, and
the transformers forward spends a third of an 8B model's step on some 1,500 small kernels:
RMSNorm's five, rotary's eight per tensor, the residual adds, the mask casts. Here each of
those groups is one function, compiled by `torch.compile` on CUDA into one kernel (the residual
add folded into the next norm), and the mask is cast to the model dtype once per pass. The
matrix products read the model's weight tensors, so nothing is copied (`Kernels.product`): a
decoding step's one row goes through a Triton matrix-vector kernel (`matvec`) that also takes
the norm before the product, the residual add after it and the MLP's activation after the gate
and up product, so those are no kernels of their own; every other product goes through cuBLAS,
beside the compiled pieces. A layer whose query, key and value projections (and gate and up
projections) the loader packed into one tensor (`models.packing`) runs each group as one
product.

Prefill goes chunk by chunk through the same layers and fused pieces (compiled for the chunk
length only, from a process's second prefill of that shape on: a first prefill, a shorter last
chunk, or a prompt shorter than a chunk runs them eagerly). A chunk attends to the keys before
it and causally within itself (`prefill_attention`: on a GPU, cuDNN's fused attention over the
earlier keys merged with the chunk's own causal block, no mask made).

The math is the transformers code's, operation for operation (the parity tests compare tokens
and selections with the TransformerLens bridge); compiled kernels may round bf16 intermediates
differently, as any fused kernel does.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields

import torch
from torch._dynamo.exc import FailOnRecompileLimitHit
from torch.nn.functional import linear, silu

from dysco_interp.decoding.backends.base import head_masks
from dysco_interp.decoding.backends.decode_attention import attend_one_query, every_key_rows, gather_kept
from dysco_interp.decoding.backends.matvec import folded
from dysco_interp.decoding.backends.prefill_attention import chunk_attention
from dysco_interp.decoding.logit_scale import logn_of, scaled
from dysco_interp.decoding.plan import Scale
from dysco_interp.models.packing import Packed, projections
from dysco_interp.models.placement import Placement

FAMILIES = ("llama", "qwen2", "qwen3")


def unsupported(hf: torch.nn.Module) -> str | None:
    """Why the model cannot run here (None: it can)."""
    config = hf.config
    if config.model_type not in FAMILIES:
        return f"model type {config.model_type!r} is not one of {', '.join(FAMILIES)}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    if any(getattr(layer.self_attn, "sliding_window", None) for layer in hf.model.layers):
        return "sliding-window layers"
    return None


# ---------------------------------------------------------------------------- the fused pieces


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream after adding `delta`, and its norm."""
    x = x + delta
    return x, rms_norm(x, weight, eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     head_dim: int, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Projections `[B, s, heads * d]` to rotated queries and keys and values `[B, heads, s, d]`
    (Qwen3 normalises each head's query and key first)."""
    batch, seq = q.shape[:2]
    q, k, v = (t.view(batch, seq, -1, head_dim) for t in (q, k, v))
    if q_norm is not None and k_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    cos, sin = cos[:, :, None], sin[:, :, None]
    # the values are copied out: a view would keep a packed projection's whole output alive
    # through the layer's attention (a prefill chunk's query, key and value rows together)
    return rotate(q, cos, sin).transpose(1, 2), rotate(k, cos, sin).transpose(1, 2), v.transpose(1, 2).contiguous()


def attention_inputs_into(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          head_dim: int, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float,
                          keys: torch.Tensor, values: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """`attention_inputs` for one decoded token, its key and value written to `slot` of the layer's
    buffers `[B, kv_heads, capacity, d]`: compiled, the writes are part of the rotary kernel
    rather than two more kernels a layer. Returns the rotated queries."""
    q, k, v = attention_inputs(q, k, v, cos, sin, head_dim, q_norm, k_norm, eps)
    keys.index_copy_(2, slot, k)
    values.index_copy_(2, slot, v)
    return q


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return silu(gate) * up


@dataclass(frozen=True)
class Kernels:
    """The fused pieces, compiled (one kernel each on CUDA) or as plain eager functions, and how
    the matrix products run (`product`)."""

    rms_norm: Callable = rms_norm
    add_rms_norm: Callable = add_rms_norm
    attention_inputs: Callable = attention_inputs
    attention_inputs_into: Callable = attention_inputs_into
    silu_mul: Callable = silu_mul
    # a keep's gather of the kept keys and values: eager, `torch.gather` takes 17 us for each of a
    # layer's 9 MB at 100K on an H200 (a quarter of the copy bandwidth); compiled, block-sparse
    # DySCO's step at 100K went from 8.5-9.0 ms to 7.3 there
    gather_kept: Callable = gather_kept
    # a product of one row with the steps beside it folded in (`matvec.folded`'s signature), or
    # None where it gives no result; None: every product by `linear`, each step its own kernel
    matvec: Callable | None = None

    @classmethod
    @functools.cache  # one set for every backend: each compiles once per shape
    def compiled(cls) -> "Kernels":
        pieces = {f.name: getattr(EAGER, f.name) for f in fields(cls) if f.name != "matvec"}
        return cls(**{name: past_recompiles(torch.compile(fn, fullgraph=True), fn) for name, fn in pieces.items()},
                   matvec=folded)

    def product(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                norm: tuple[torch.Tensor, float] | None = None, glu: bool = False) -> torch.Tensor:
        """`linear(x, weight, bias)` of `x` through an RMS norm first (`norm`: its weight and
        epsilon); `glu`: the weight a gate projection's rows followed by an up projection's, the
        output `silu(gate) * up`. One kernel where `matvec` runs, else the pieces."""
        if self.matvec is not None:
            out = self.matvec(x, weight, bias, norm=norm, glu=glu)
            if out is not None:
                return out
        if norm is not None:
            x = self.rms_norm(x, *norm)
        out = linear(x, weight, bias)
        return self.silu_mul(*out.chunk(2, dim=-1)) if glu else out

    def residual_product(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         residual: torch.Tensor, norm: tuple[torch.Tensor, float] | None = None,
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The residual stream after the product, `residual + linear(x, weight, bias)`, and its
        RMS norm under `norm`: None where no norm is asked for, or where `matvec` ran and leaves
        the norm to the next product to fold in. Elsewhere the add and the norm are one piece,
        as before any product folded a step in."""
        if self.matvec is not None:
            out = self.matvec(x, weight, bias, residual=residual)
            if out is not None:
                return out, None
        delta = linear(x, weight, bias)
        return (residual + delta, None) if norm is None else self.add_rms_norm(residual, delta, *norm)


def past_recompiles(compiled: Callable, eager: Callable) -> Callable:
    """`compiled`, or `eager` for a call torch's compiler refuses to compile once more.

    Each piece is compiled anew for every device, dtype, model constant and batch shape it
    meets, and the compiler stops at a limit of such variants a function (8 in torch 2.11): a
    process that decodes several models, or one model split over two GPUs in two dtypes, met
    it. It refuses before running anything, so the call runs as written, and that is said once."""
    def run(*args, **kwargs):
        try:
            return compiled(*args, **kwargs)
        except FailOnRecompileLimitHit:
            if eager not in REFUSED:
                REFUSED.add(eager)
                warnings.warn(f"torch's compiler has compiled {eager.__name__} for as many devices, dtypes and "
                              f"shapes as it allows in one process (torch._dynamo.config.recompile_limit); "
                              f"a call that needs another runs uncompiled", RuntimeWarning, stacklevel=2)
            return eager(*args, **kwargs)
    return run


REFUSED: set[Callable] = set()  # the pieces torch's compiler stopped compiling in this process


EAGER = Kernels()

# (batch, chunk size, dtype, device) of every prefill of full chunks this process has run. Compiling
# the pieces for a prefill shape takes seconds (6-7 s for Qwen3-8B's on an H200) and saves about 10%
# of a long prefill, so a process pays it only at its second prefill of a shape: one prompt from the
# command line never does, an evaluation over many prompts does once.
PREFILLED: set[tuple[int, int, torch.dtype, torch.device]] = set()


# ---------------------------------------------------------------------------- one pass


@dataclass
class DecodePass:
    """What one decoding pass over fixed buffers does: its masks (float32 `mask` `[B, 1, 1, capacity]`
    for unbiased layers, `biased` `[B, 1 or heads, 1, capacity]`, the bias included, for
    `bias_layers`), its logit scale, where the token's key goes, and which heads it reads."""

    mask: torch.Tensor
    slot: torch.Tensor  # long [1]
    scale: Scale | None = None  # the pass's logit scale
    scale_heads: Mapping[int, torch.Tensor] = field(default_factory=dict)  # layer -> `base.head_masks` of the scale
    logn: torch.Tensor | None = None  # float32 [B, 1, 1, 1]: each row's log-n factor (a fixed tensor)
    decode_attention: str = "sdpa"
    read: Mapping[int, Sequence[int]] = field(default_factory=dict)  # layer -> query heads, as ints
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> float32 rows [B, h, capacity]
    biased: torch.Tensor | None = None
    bias_layers: frozenset[int] = frozenset()
    # layer -> bool [1, heads, 1, 1]: the heads its bias applies to (a layer not here: all)
    bias_heads: Mapping[int, torch.Tensor] = field(default_factory=dict)
    # a plan's keep (`plan.Keep`): its layers read only the keys at `kept` (long [B, C]), `hidden`
    # (float32 [B, 1, 1, C]) -inf at its slots that name no key
    kept: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    keep_layers: frozenset[int] = frozenset()

    def masks(self, layer: int, dtype: torch.dtype, cast: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The float32 mask of `layer` and the same in `dtype` (`cast` keeps the casts of one pass)."""
        if layer not in self.bias_layers:
            return self.mask, cast["mask"]
        assert self.biased is not None
        chosen = self.bias_heads.get(layer)
        if chosen is None:
            if "biased" not in cast:
                cast["biased"] = self.biased.to(dtype)
            return self.biased, cast["biased"]
        mask = torch.where(chosen, self.biased, self.mask)
        return mask, mask.to(dtype)


def products(x: torch.Tensor, normed: torch.Tensor | None, norm: tuple[torch.Tensor, float], packs: Packed,
             modules: Sequence[torch.nn.Linear], kernels: Kernels, glu: bool = False) -> Sequence[torch.Tensor]:
    """Each module's output on the RMS norm (`norm`: weight, epsilon) of the stream `x`, or with
    `glu` the MLP's activation of the gate's and the up projection's: one product over the packed
    weight when `packs` finds one (the same modules), the norm folded in unless it is given
    (`normed`); else the norm once and one product each."""
    found = packs.found()
    if found is None and normed is None:
        normed = kernels.rms_norm(x, *norm)
    h, fold = (x, norm) if normed is None else (normed, None)
    if found is not None:
        out = kernels.product(h, *found, norm=fold, glu=glu)
        return [out] if glu else out.split(packs.sizes, dim=-1)
    outs = [kernels.product(h, m.weight, m.bias) for m in modules]
    return [kernels.silu_mul(*outs)] if glu else outs


def norm_of(module: torch.nn.Module) -> tuple[torch.Tensor, float]:
    """An RMS norm module's weight and epsilon."""
    return module.weight, module.variance_epsilon


Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class FusedDecoder:
    """The layers of `hf` (a model `unsupported` accepts) as explicit passes.

    `kernels`: `Kernels.compiled()` fuses the small operations on CUDA; `EAGER` runs them as
    written (the CPU, and the reference the GPU checks compare with).
    """

    def __init__(self, hf: torch.nn.Module, kernels: Kernels = EAGER, placement: Placement | None = None):
        reason = unsupported(hf)
        if reason is not None:
            raise ValueError(f"the fused decoder cannot run this model: {reason}")
        self.hf, self.kernels = hf, kernels
        self.compiled = kernels is not EAGER
        self.layers = list(hf.model.layers)
        attn = self.layers[0].self_attn
        self.head_dim, self.groups = attn.head_dim, attn.num_key_value_groups
        self.n_layers = len(self.layers)
        # per layer: its attention's and its MLP's projections, each group one product when packed
        self.packs = [(Packed(projections(layer, "attention") or ()), Packed(projections(layer, "mlp") or ()))
                      for layer in self.layers]
        self.placement = placement or Placement.single(hf.model.embed_tokens.weight.device, self.n_layers)
        self.lm_device = hf.lm_head.weight.device
        # the rotary frequencies on every device of a split (cos and sin are made where they are used)
        rotary = hf.model.rotary_emb
        self.rotaries = {rotary.inv_freq.device: rotary}
        for device in self.placement.devices:
            if device not in self.rotaries:  # made anew: a copy would keep the dispatch hook's device
                self.rotaries[device] = type(rotary)(hf.config, device=device)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.hf.model.embed_tokens(ids)

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """float32 logits of the last position of the final norm's output."""
        return self.hf.lm_head(normed[:, -1:].to(self.lm_device))[:, -1].float()

    def _norm_after(self, index: int) -> torch.nn.Module:
        """The norm the residual stream goes through after layer `index`'s MLP."""
        return self.layers[index + 1].input_layernorm if index + 1 < self.n_layers else self.hf.model.norm

    def layers_between(self, x: torch.Tensor, positions: torch.Tensor, start: int, stop: int, attend: Attend,
                       kernels: Kernels, cache: tuple[Sequence, torch.Tensor] | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Layers start..stop-1 on the residual stream `x` `[B, s, D]`; returns the stream and, when
        `stop` is the last layer, its final norm (which the logits read).

        `attend(layer, q, keys, values)` gets the chunk's own keys and values, or, when decoding
        into `cache` (each layer's (keys, values) buffers, and the slot of the token), the whole
        buffers with the token's key and value already written."""
        k = kernels
        if start < stop:
            cos, sin = self.rotaries[x.device](x, positions)
        normed = None  # the stream's norm, where no product folds it in
        for index in range(start, stop):
            layer = self.layers[index]
            attn, mlp = layer.self_attn, layer.mlp
            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            attn_packs, mlp_packs = self.packs[index]
            inputs = (*products(x, normed, norm_of(layer.input_layernorm), attn_packs,
                                (attn.q_proj, attn.k_proj, attn.v_proj), k),
                      cos, sin, self.head_dim,
                      None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight,
                      0.0 if q_norm is None else q_norm.variance_epsilon)
            if cache is None:
                q, key, value = k.attention_inputs(*inputs)
            else:
                key, value = cache[0][index]
                q = k.attention_inputs_into(*inputs, key, value, cache[1])
            out = attend(index, q, key, value)  # [B, s, heads * d]
            post = norm_of(layer.post_attention_layernorm)
            x, normed = k.residual_product(out, attn.o_proj.weight, attn.o_proj.bias, x, post)
            (act,) = products(x, normed, post, mlp_packs, (mlp.gate_proj, mlp.up_proj), k, glu=True)
            following = self._norm_after(index) if index + 1 < stop or stop == self.n_layers else None
            x, normed = k.residual_product(act, mlp.down_proj.weight, mlp.down_proj.bias, x,
                                           None if following is None else norm_of(following))
            del act  # a prefill chunk's largest tensor: not kept through the next layer's attention
        if stop < self.n_layers:
            return x, None
        return x, normed if normed is not None else k.rms_norm(x, *norm_of(self.hf.model.norm))

    def decode(self, x: torch.Tensor, positions: torch.Tensor, cache_buffers: Sequence, step: DecodePass,
               start: int = 0, stop: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One token per row (`x` `[B, 1, D]`) through layers start..stop-1: its key and value go
        to `step.slot` of each layer's buffers (`cache_buffers[layer]` = (keys, values)
        `[B, kv_heads, capacity, d]`), and it attends over the whole buffers under `step.mask`.
        The layers are on one device, as are `x`, `positions` and `step`'s tensors (a split
        model decodes one `Placement.segments` run at a time)."""
        stop = self.n_layers if stop is None else stop
        cast = {"mask": step.mask.to(x.dtype)}  # once per pass, not per layer

        def attend(index: int, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            q, scale = scaled(q, self.layers[index].self_attn.scaling, step.scale, index, step.scale_heads.get(index),
                              step.logn)
            mask, model_mask = step.masks(index, x.dtype, cast)
            heads = step.read.get(index)
            if index in step.keep_layers:  # only the kept keys and values are read
                assert step.kept is not None and step.hidden is not None
                if heads is not None:  # except by a read, which covers every key
                    step.rows[index], heads = every_key_rows(q, keys, mask, scale, self.groups, heads), None
                keys, values, mask = self.kernels.gather_kept(keys, values, mask, step.kept, step.hidden)
                model_mask = mask.to(x.dtype)
            out, rows = attend_one_query(q, keys, values, mask, scale, self.groups, step.decode_attention,
                                         heads, model_mask=model_mask)
            if rows is not None:
                step.rows[index] = rows
            return out.reshape(*out.shape[:2], -1)

        return self.layers_between(x, positions, start, stop, attend, self.kernels, (cache_buffers, step.slot))

    def prefill(self, ids: torch.Tensor, append: Callable[[torch.Tensor, torch.Tensor, int], tuple],
                chunk_size: int, scale: Scale | None = None) -> None:
        """The prompt `ids` `[B, n]` (no pads) chunk by chunk, its attention under `scale`:
        `append(keys, values, layer)` stores a chunk's keys and values after the earlier ones and
        returns everything stored so far."""
        n = ids.shape[1]
        chosen = head_masks(scale, self.hf.config.num_attention_heads,
                            lambda layer: self.layers[layer].self_attn.q_proj.weight.device)
        shape = (ids.shape[0], chunk_size, self.hf.model.embed_tokens.weight.dtype, ids.device)
        # the first prefill of a shape in the process runs the pieces eagerly, the later ones compiled
        kernels_for_full = self.kernels if shape in PREFILLED else EAGER
        if n >= chunk_size:
            PREFILLED.add(shape)
        for start in range(0, n, chunk_size):
            chunk = ids[:, start:start + chunk_size]
            positions = torch.arange(start, start + chunk.shape[1], device=ids.device).expand(chunk.shape[0], -1)
            logn = logn_of(scale, positions + 1)

            def attend(index: int, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       logn: torch.Tensor | None = logn) -> torch.Tensor:
                keys, values = append(key, value, index)
                q, softmax_scale = scaled(q, self.layers[index].self_attn.scaling, scale, index, chosen.get(index),
                                          None if logn is None else logn.to(q.device))
                out = chunk_attention(q, keys, values, softmax_scale, self.groups)
                return out.transpose(1, 2).reshape(*q.shape[:1], q.shape[2], -1)

            # the final norm and logits are not needed: decoding starts from the next token
            x = self.embed(chunk)
            # a shorter last chunk runs eagerly: a compile for its shape costs more than it saves
            kernels = kernels_for_full if chunk.shape[1] == chunk_size else EAGER
            for part, first, stop in self.placement.segments():
                device = self.placement.devices[part]
                x, _ = self.layers_between(x.to(device), positions.to(device), first, stop, attend, kernels)
