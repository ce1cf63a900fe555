"""The "flex" backend: the SDPA backend's cache and prefill, its decoding steps through FlexAttention.

Each decoding query attends through `torch.nn.attention.flex_attention`, the plan carried out
inside the kernel rather than as a dense mask added before it:
- the additive part (the plan's bias, shared by the heads or one row per head, its mask's -inf,
  and the left pads' -inf) is one float32 tensor per layer, `[B, 1 or heads, n_keys]`, that the
  `score_mod` indexes (`score + add[b, h, k]`);
- the softmax scale and a plan's `Scale` are one float32 factor `[B, heads]` the `score_mod`
  multiplies q.k by (`score * factor[b, h]`): a temperature on whole layers divides the softmax
  scale (as exact as the model's own 1/sqrt(d), as on the other backends), a temperature on some
  heads and log-n growth multiply it. As a float argument the scale would be a constant of the
  compiled kernel, one kernel per temperature;
- a plan's keep (`plan.Keep`) is what it means, a -inf on every key it does not name, added to
  the additive tensor of the kept layers (the sdpa and static backends gather the kept keys
  instead; the tokens are the same);
- reads: the QRHeads' rows are computed from their own q.K in float32 with the same factor and
  the same additive tensor, as the SDPA backend computes them (a kernel returns at most the
  logsumexp, and a row needs the scores anyway).
The `score_mod` only indexes tensors it captures, so one compiled kernel serves every step: the
rows and the key count are marked dynamic, and a new step's tensors are new inputs, never a
recompile. The compiled kernel also gets a block mask of every key in `KV_BLOCK`-key blocks
(`every_key`): FlexDecoding splits the keys over the device by those blocks. There are three
kernels per model at most (no additive tensor, a shared one, one per head).

`FlexOptions.compile_kernels`: None (the default) compiles `flex_attention` with `torch.compile`
on CUDA devices and runs it eagerly elsewhere (unfused: the scores are materialized, exact and
slow); True compiles it on a CPU too (with a C++ compiler), False never. A kernel the compiler
fails to build (torch 2.13's CPU template fails for some shapes) runs eagerly, said once per
process. A CPU build cannot return the logsumexp from a compiled kernel, which the reads above
never need.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch.nn.attention.flex_attention import BlockMask
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from dysco_interp.decoding import relevance
from dysco_interp.decoding.backends.base import Backend, BackendOptions, DecodeState
from dysco_interp.decoding.backends.decode_attention import row_softmax
from dysco_interp.decoding.backends.sdpa import AttentionControl, SdpaBackend, dysco_attention, twin
from dysco_interp.decoding.logit_scale import query_scaling
from dysco_interp.decoding.plan import PassPlan, keep_mask
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import Hook
from dysco_interp.models import LoadedModel

ATTN_IMPLEMENTATION = "dysco_flex"

# FlexDecoding splits a query's keys over the device by the blocks of the block mask. Without one,
# the default mask is a single block, and one program per KV head reads every key: 3.3 ms a layer
# at 100K on an H200, against 0.15 ms with blocks of this size (and 0.11 for SDPA's cuDNN kernel)
KV_BLOCK = 128

# kernels one process may compile (torch's default, 8, is two models' worth here: three structures
# of the score_mod, each for one row and for several, since a dynamic size is never 1)
RECOMPILE_LIMIT = 64

ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class FlexKernel:
    """`flex_attention`, compiled or eager (see the module docstring). A kernel the compiler fails
    to build runs eagerly from then on (said once per process); the others stay compiled."""

    _compiled: Callable | None = None  # one compiled function for every backend: its kernels are shared
    _told = False

    def __init__(self, compile_kernels: bool | None, device: torch.device):
        self.compiled = device.type == "cuda" if compile_kernels is None else compile_kernels
        self.failed: dict[tuple, str] = {}  # (score_mod structure, rows, device type) -> why it did not build

    @property
    def fallback_reason(self) -> str | None:
        return next(iter(self.failed.values()), None)

    @classmethod
    def compiled_flex(cls) -> Callable:
        if cls._compiled is None:
            from torch.nn.attention.flex_attention import flex_attention

            cls._compiled = torch.compile(flex_attention)
        return cls._compiled

    def __call__(self, query, key, value, factor: torch.Tensor, add: torch.Tensor | None, gqa: bool,
                 blocks: Callable[[], BlockMask]) -> torch.Tensor:
        """Attention of `query` `[B, heads, 1, d]` over `key`, `value` `[B, kv_heads, n, d]` with
        the scores `(q.k) * factor[b, h] + add[b, h, k]` (`score_mod_for`); `blocks()` gives every
        key in blocks (`every_key`), for the compiled kernel only."""
        score_mod = score_mod_for(factor, add)
        structure = (score_mod.__name__, query.shape[0], query.device.type)
        if self.compiled and structure not in self.failed:
            # the key count changes every step: marked dynamic, one kernel serves every step; the rows
            # stay static (a kernel per batch size) and so does the softmax scale, which is in `factor`
            # (as a float argument it would be a constant of the kernel, one kernel per temperature)
            for t in (query, key, value, factor, add):
                if t is not None:
                    torch._dynamo.mark_static(t, 0)
            for t in (key, value, add):
                if t is not None:
                    torch._dynamo.maybe_mark_dynamic(t, 2)
            mask = blocks()
            torch._dynamo.maybe_mark_dynamic(mask.kv_indices, 3)
            try:
                with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                    return self.compiled_flex()(query, key, value, score_mod=score_mod, scale=1.0, enable_gqa=gqa,
                                                block_mask=mask)
            except Exception as e:  # noqa: BLE001 (any failure of the compiler: the eager kernel is exact)
                reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                self.failed[structure] = reason
                if not FlexKernel._told:
                    FlexKernel._told = True
                    warnings.warn(f"torch.compile(flex_attention) failed on {query.device.type} ({reason}); the "
                                  "flex backend runs that kernel eagerly (exact, slower)", RuntimeWarning,
                                  stacklevel=2)
        from torch.nn.attention.flex_attention import flex_attention

        with warnings.catch_warnings():  # torch's advice to compile: the eager kernel is chosen here
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return flex_attention(query, key, value, score_mod=score_mod, scale=1.0, enable_gqa=gqa)


def every_key(n_keys: int, device: torch.device) -> BlockMask:
    """A block mask that hides nothing, over `n_keys` keys in blocks of `KV_BLOCK` (the last one
    partial: the kernel bounds it by the key count)."""
    n_blocks = -(-n_keys // KV_BLOCK)
    counts = torch.full((1, 1, 1), n_blocks, dtype=torch.int32, device=device)
    indices = torch.arange(n_blocks, dtype=torch.int32, device=device).view(1, 1, 1, n_blocks)
    return BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=(KV_BLOCK, KV_BLOCK), seq_lengths=(1, n_keys),
                                    compute_q_blocks=False)


def score_mod_for(factor: torch.Tensor, add: torch.Tensor | None) -> ScoreMod:
    """The `score_mod` that multiplies the raw q.k by `factor` `[B, heads]` (the softmax scale and
    the plan's scale) and adds `add` `[B, 1 or heads, n_keys]`: three structures in all, each
    closing over this step's tensors."""
    if add is None:
        def scaled(score, b, h, q, k):
            return score * factor[b, h]
        return scaled
    if add.shape[1] == 1:
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
    factors: dict[tuple, torch.Tensor] = field(default_factory=dict)  # a layer's scaling -> its factor [B, heads]
    # (keys seen, biased heads) -> (the model's mask it was made with, the additive tensor)
    additive: dict[tuple, tuple] = field(default_factory=dict)
    blocks: dict[int, BlockMask] = field(default_factory=dict)  # keys seen -> `every_key` (made once a pass)

    def every_key(self, n_keys: int, device: torch.device) -> BlockMask:
        made = self.blocks.get(n_keys)
        if made is None:
            made = self.blocks[n_keys] = every_key(n_keys, device)
        return made


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
    if out is not None:  # a tensor of its own, made here: the kernel's guards see one layout, one kind of tensor
        out = out.to(device).expand(batch, -1, -1).clone(memory_format=torch.contiguous_format)
    ctl.additive[key] = (mask, out)
    return out


def kept_part(ctl: FlexControl, n_visible: int, device: torch.device) -> torch.Tensor:
    """float32 `[B, 1, n_visible]`: -inf on every key the plan's keep does not name (made once a pass)."""
    made = ctl.additive.get(("keep", n_visible))
    if made is None:
        assert ctl.keep is not None
        kept = keep_mask(*ctl.keep, ctl.n_keys)[:, ctl.n_keys - n_visible:].to(device)
        made = ctl.additive[("keep", n_visible)] = (None, torch.zeros(kept.shape, device=device).masked_fill_(
            ~kept, -torch.inf)[:, None, :])
    return made[1]


def head_rows(query, key, heads: torch.Tensor, groups: int, factor: torch.Tensor,
              add: torch.Tensor | None) -> torch.Tensor:
    """The float32 softmax rows of the query heads `heads`, `[B, h, n]`: the scores the kernel
    sees (times `factor`, plus `add`), from a float32 q.K of those heads only."""
    q = query[:, heads, -1, :].float()
    k = key[:, torch.div(heads, groups, rounding_mode="floor")].float()
    scores = torch.einsum("bhd,bhnd->bhn", q, k) * factor[:, heads, None]
    if add is not None:
        scores = scores + (add if add.shape[1] == 1 else add[:, heads])
    return row_softmax(scores)


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
    scaled = ctl.scale is not None and layer in ctl.scale.layers
    chosen = ctl.scale_heads.get(layer) if scaled else None
    kind = (scale, scaled, None if chosen is None else id(chosen))  # layers scaled alike share a factor
    factor = ctl.factors.get(kind)
    if factor is None:
        per = None
        if ctl.scale is not None and scaled:
            divisor, per = query_scaling(ctl.scale, chosen, ctl.logn)
            scale = scale / divisor
        made = torch.full((batch, n_heads, 1, 1), scale, dtype=torch.float32, device=query.device)
        if per is not None:
            made = made * per.to(device=query.device, dtype=torch.float32)
        factor = ctl.factors[kind] = made.reshape(batch, n_heads).contiguous()
    if layer in ctl.bias_layers and ctl.bias is None and ctl.rule is not None:
        ctl.bias = ctl.rule()
    add = additive(ctl, layer, attention_mask, key.shape[-2], batch, n_heads, query.device)
    heads = ctl.read.get(layer)
    if heads is not None:  # a read in a biased layer sees the attention as the pass uses it; in a kept one, every key
        ctl.rows[layer] = head_rows(query, key, heads, groups, factor, add)
    if layer in ctl.keep_layers and ctl.keep is not None:  # a keep as what it means: -inf outside it
        hidden = kept_part(ctl, key.shape[-2], query.device)
        add = hidden.contiguous() if add is None else (add + hidden).contiguous()
    out = ctl.kernel(query, key, value, factor, add, groups > 1,
                     functools.partial(ctl.every_key, key.shape[-2], query.device))
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTN_IMPLEMENTATION, flex_attention_step)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


@dataclass(frozen=True)
class FlexOptions(BackendOptions):
    """The flex backend's options.

    Args:
        compile_kernels: compile `flex_attention` with `torch.compile` (None: on CUDA devices;
            False: the eager kernel, exact and unfused; True on a CPU: compiled where torch's
            compiler builds the kernel, which torch 2.13 does not for every shape).
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
        self.kernel = FlexKernel(self.options.compile_kernels, model.device)
        self.decoder = twin(model, ATTN_IMPLEMENTATION)

    def _control(self, plan: PassPlan, state: DecodeState) -> AttentionControl:
        ctl = super()._control(plan, state)
        return FlexControl(**vars(ctl), kernel=self.kernel)
