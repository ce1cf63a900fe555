"""The "flex" backend: the SDPA backend's cache and prefill, its decoding steps through FlexAttention.

Each decoding query attends through `torch.nn.attention.flex_attention`, the plan carried out
inside the kernel rather than as a dense mask added before it:
- the additive part (the plan's bias, shared by the heads or one row per head, its mask's -inf,
  and the left pads' -inf) is one float32 tensor per layer, `[B, 1 or heads, n_keys]`, that the
  `score_mod` indexes (`score + add[b, h, k]`);
- a `Scale`: a temperature on whole layers divides the softmax scale (as exact as the model's own
  1/sqrt(d), as on the other backends); a temperature on some heads, or log-n growth, is a float32
  factor `[B, heads]` the `score_mod` multiplies the scores by (`score * factor[b, h]`);
- reads: the QRHeads' rows are computed from their own q.K in float32 with the same factor and
  the same additive tensor, as the SDPA backend computes them (a kernel returns at most the
  logsumexp, and a row needs the scores anyway).
The `score_mod` only indexes tensors it captures, so one compiled kernel serves every step: the
key count is marked dynamic, and a new step's tensors are new inputs, never a recompile.

`FlexOptions.compile_kernels`: None (the default) compiles `flex_attention` with `torch.compile`
where that works (CUDA; a CPU with a C++ compiler) and otherwise runs it eagerly, saying so once;
True requires the compiled kernel; False runs it eagerly (unfused: the scores are materialized,
which is slow but exact). A CPU build cannot return the logsumexp from a compiled kernel, which
the reads above never need.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from dysco_interp.decoding import relevance
from dysco_interp.decoding.backends.base import Backend, BackendOptions, DecodeState
from dysco_interp.decoding.backends.sdpa import AttentionControl, SdpaBackend, dysco_attention, twin
from dysco_interp.decoding.logit_scale import query_scaling
from dysco_interp.decoding.plan import PassPlan
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import Hook
from dysco_interp.models import LoadedModel

ATTN_IMPLEMENTATION = "dysco_flex"

ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class FlexKernel:
    """`flex_attention`, compiled where it can be (see the module docstring)."""

    _compiled: Callable | None = None  # one compiled function for every backend: its kernels are shared
    _told = False  # the eager fallback is said once per process

    def __init__(self, compile_kernels: bool | None):
        self.required = compile_kernels is True
        self.compiled = compile_kernels is not False
        self.fallback_reason: str | None = None

    @classmethod
    def compiled_flex(cls) -> Callable:
        if cls._compiled is None:
            from torch.nn.attention.flex_attention import flex_attention

            cls._compiled = torch.compile(flex_attention)
        return cls._compiled

    def __call__(self, query, key, value, score_mod: ScoreMod | None, scale: float, gqa: bool) -> torch.Tensor:
        if self.compiled:
            # the key count changes every step: marked dynamic, one kernel serves them all
            for t in (key, value):
                torch._dynamo.maybe_mark_dynamic(t, 2)
            try:
                return self.compiled_flex()(query, key, value, score_mod=score_mod, scale=scale, enable_gqa=gqa)
            except Exception as e:  # noqa: BLE001 (any failure of the compiler: the eager kernel is exact)
                if self.required:
                    raise ConfigError(f"the flex backend's compiled kernel failed on {query.device.type}: "
                                      f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
                self.compiled = False
                self.fallback_reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                if not FlexKernel._told:
                    FlexKernel._told = True
                    warnings.warn(f"torch.compile(flex_attention) failed on {query.device.type} "
                                  f"({self.fallback_reason}); the flex backend runs FlexAttention eagerly (exact, "
                                  "slow)", RuntimeWarning, stacklevel=2)
        from torch.nn.attention.flex_attention import flex_attention

        with warnings.catch_warnings():  # torch's advice to compile: the eager kernel is chosen here
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return flex_attention(query, key, value, score_mod=score_mod, scale=scale, enable_gqa=gqa)


def score_mod_for(add: torch.Tensor | None, factor: torch.Tensor | None) -> ScoreMod | None:
    """The `score_mod` that multiplies by `factor` `[B, heads]` and adds `add` `[B, 1 or heads,
    n_keys]` (None: neither). One function per structure, closing over this step's tensors."""
    if add is None and factor is None:
        return None
    if add is None:
        assert factor is not None

        def scaled(score, b, h, q, k):
            return score * factor[b, h]
        return scaled
    shared = add.shape[1] == 1
    if factor is None:
        if shared:
            def added(score, b, h, q, k):
                return score + add[b, 0, k]
            return added

        def added_per_head(score, b, h, q, k):
            return score + add[b, h, k]
        return added_per_head
    if shared:
        def scaled_added(score, b, h, q, k):
            return score * factor[b, h] + add[b, 0, k]
        return scaled_added

    def scaled_added_per_head(score, b, h, q, k):
        return score * factor[b, h] + add[b, h, k]
    return scaled_added_per_head


@dataclass
class FlexControl(AttentionControl):
    """A pass plan as the flex attention function needs it."""

    kernel: FlexKernel | None = None
    # (keys seen, biased heads) -> (the model's mask it was made with, the additive tensor)
    additive: dict[tuple, tuple] = field(default_factory=dict)


def pad_part(mask, batch: int) -> torch.Tensor | None:
    """The model's mask for the last query as float32 `[B, 1, n]` (0 or -inf; None: no mask)."""
    if mask is None:
        return None
    last = mask[:, :, -1, :]
    part = torch.zeros(last.shape, dtype=torch.float32, device=last.device).masked_fill_(~last, -torch.inf) \
        if last.dtype == torch.bool else last.float()
    return part.expand(batch, 1, -1)


def additive(ctl: FlexControl, layer: int, mask, n_visible: int, batch: int, n_heads: int,
             device: torch.device) -> torch.Tensor | None:
    """What the layer adds to its scores, float32 `[B, 1 or heads, n_visible]`: the model's mask,
    and in a biased layer the pass's bias and mask (on its biased heads only; None: nothing)."""
    biased = layer in ctl.bias_layers and ctl.bias is not None
    chosen = ctl.bias_heads.get(layer) if biased else None
    # a plan's head tensors live as long as the backend's controls: their ids tell them apart
    key = (n_visible, None if not biased else "all" if chosen is None else id(chosen))
    made = ctl.additive.get(key)
    if made is not None and made[0] is mask:
        return made[1]
    out = pad_part(mask, batch)
    if biased:
        assert ctl.bias is not None
        bias = relevance.window_slice(ctl.bias, n_visible)[:, :, 0].to(device=device, dtype=torch.float32)
        if chosen is not None:  # where, not a product: a mask's -inf times 0 would be NaN
            on = torch.zeros(n_heads, dtype=torch.bool, device=device)
            on[chosen.to(device)] = True
            bias = torch.where(on[None, :, None], bias, 0.0)
        out = bias if out is None else out.to(device) + bias
    if out is not None:
        out = out.to(device).expand(batch, -1, -1).contiguous()
    ctl.additive[key] = (mask, out)
    return out


def head_rows(query, key, heads: torch.Tensor, scale: float, groups: int, factor: torch.Tensor | None,
              add: torch.Tensor | None) -> torch.Tensor:
    """The float32 softmax rows of the query heads `heads`, `[B, h, n]`: the scores the kernel
    sees (times `factor`, plus `add`), from a float32 q.K of those heads only."""
    q = query[:, heads, -1, :].float()
    k = key[:, torch.div(heads, groups, rounding_mode="floor")].float()
    scores = torch.einsum("bhd,bhnd->bhn", q, k) * scale
    if factor is not None:
        scores = scores * factor[:, heads, None]
    if add is not None:
        scores = scores + (add if add.shape[1] == 1 else add[:, heads])
    return scores.softmax(dim=-1)


def flex_attention_step(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                        dysco_control: AttentionControl | None = None, **kwargs):
    """One decoding query per row through FlexAttention with a pass's reads, bias, mask and scale;
    anything else (the prompt, a pass without a flex control) is the SDPA backend's."""
    ctl = dysco_control
    if not isinstance(ctl, FlexControl) or query.shape[2] != 1:
        return dysco_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                               dysco_control=ctl, **kwargs)
    assert ctl.kernel is not None
    batch, n_heads = query.shape[0], query.shape[1]
    groups = getattr(module, "num_key_value_groups", 1)
    layer = module.layer_idx
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    factor = None
    if ctl.scale is not None and layer in ctl.scale.layers:
        divisor, per = query_scaling(ctl.scale, ctl.scale_heads.get(layer), ctl.logn)
        scale = scale / divisor
        if per is not None:
            factor = per.to(device=query.device, dtype=torch.float32).expand(batch, n_heads, 1, 1)
            factor = factor.reshape(batch, n_heads).contiguous()
    if layer in ctl.bias_layers and ctl.bias is None and ctl.rule is not None:
        ctl.bias = ctl.rule()
    add = additive(ctl, layer, attention_mask, key.shape[-2], batch, n_heads, query.device)
    heads = ctl.read.get(layer)
    if heads is not None:  # a read in a biased layer sees the attention as the pass uses it
        ctl.rows[layer] = head_rows(query, key, heads, scale, groups, factor, add)
    out = ctl.kernel(query, key, value, score_mod_for(add, factor), scale, groups > 1)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTN_IMPLEMENTATION, flex_attention_step)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


@dataclass(frozen=True)
class FlexOptions(BackendOptions):
    """The flex backend's options.

    Args:
        compile_kernels: compile `flex_attention` (None: where `torch.compile` works, else eager,
            said once; True: compiled or a ConfigError at the first step; False: eager).
    """

    compile_kernels: bool | None = None

    def __post_init__(self) -> None:
        if self.compile_kernels is not None and not isinstance(self.compile_kernels, bool):
            raise ConfigError(f"compile_kernels is True, False or None, got {self.compile_kernels!r}")

    def described(self, backend: Backend) -> dict:
        assert isinstance(backend, FlexBackend)
        kernel = backend.kernel
        return {"decode_attention": "flex", "compiled_kernels": kernel.compiled,
                "fallback": kernel.fallback_reason}


class FlexBackend(SdpaBackend):
    """The SDPA backend with its decoding steps through FlexAttention; rows of different lengths
    decode together (left padding). `options`: `FlexOptions`."""

    name = "flex"
    Options = FlexOptions
    max_batch = None

    def __init__(self, model: LoadedModel, *, graphs: bool | None = None, hooks: Sequence[Hook] = (),
                 options: FlexOptions | None = None, tau: float | None = None):
        super().__init__(model, graphs=graphs, hooks=hooks, tau=tau)
        self.options = FlexOptions() if options is None else options
        self.kernel = FlexKernel(self.options.compile_kernels)
        self.decoder = twin(model, ATTN_IMPLEMENTATION)

    def _control(self, plan: PassPlan, state: DecodeState) -> AttentionControl:
        ctl = super()._control(plan, state)
        return FlexControl(**vars(ctl), kernel=self.kernel)
