"""The "static" backend: decoding steps whose shapes never change, replayed as CUDA graphs.

At batch 1 a decoding step of an 8B model moves a few milliseconds' worth of bytes but
spends tens of milliseconds in Python and kernel launches, and a `DynamicCache` copies
the whole cache at every step. Here:
- prefill (SDPA, chunked) writes into key/value buffers of fixed capacity;
- a decoding step writes its key/value at the slot a device tensor names and attends
  over the whole buffer with an additive float32 mask: 0 for real keys, -inf for pads
  and empty slots, plus log(beta) on DySCO's selected keys;
- each pass plan is captured once per state on a GPU, keyed by the plan's structure, and
  replayed; on the CPU the same code runs eagerly, which the parity tests check;
- a plan's keep (`plan.Keep`) is fixed tensors too (`StaticState.keep`): its layers gather the
  kept keys and values at those positions and attend over them only (sparse decoding).

Models of the Llama family (Llama, Qwen2, Qwen3) run their passes, and unpadded prompts their
prefill, through `fused_decoder.FusedDecoder`: the layers written out over the same weights,
with their small operations fused into single kernels on CUDA. Other models (sliding-window
layers among them) run the transformers forward with `static_attention` as their attention
function, and prefill through the SDPA backend's (`sdpa.prefill_into`), as padded prompts do.

The decoding attention of the single query is "sdpa" (fused, the default) or "float32" (the
reference); see `decode_attention`. Sliding-window layers always take the float32 path. A pass
that does not write the cache writes the slot too; the pass that does rewrites it.

A plan whose bias a rule builds from the pass's own read ("dysco-reuse") is two captured
segments: the layers before the first biased one, then the rule on the host, then the rest
on the hidden state the first segment left.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from dysco_interp.decoding import runtime
from dysco_interp.decoding.backends.base import (
    Backend,
    BackendOptions,
    DecodeState,
    StepOutput,
    StopForward,
    head_masks,
    stop_after,
)
from dysco_interp.decoding.backends.decode_attention import (
    attend_one_query,
    check_decode_attention,
    every_key_rows,
    gather_kept,
)
from dysco_interp.decoding.backends.fused_decoder import EAGER, DecodePass, FusedDecoder, Kernels, unsupported
from dysco_interp.decoding.backends.matvec import folded, has_triton
from dysco_interp.decoding.backends.sdpa import (
    AttentionControl,
    decoder_layers,
    dysco_attention,
    prefill_into,
    twin,
)
from dysco_interp.decoding.backends.slot_cache import SlotCache, capacity_for
from dysco_interp.decoding.choices import DEFAULT_DECODE_ATTENTION
from dysco_interp.decoding.logit_scale import scaled
from dysco_interp.decoding.plan import PassPlan, Scale, logn_factor
from dysco_interp.decoding.readout import read_outs
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import Hook
from dysco_interp.models import LoadedModel

ATTN_IMPLEMENTATION = "dysco_static"
CUDA_PREFILL_CHUNK = 8192  # large products and few launches; the fused attention kernels need no mask


@dataclass
class Fixed:
    """The fixed tensors one device's captured passes read."""

    mask: torch.Tensor  # float32 [B, 1, 1, capacity]
    biased: torch.Tensor  # mask plus the step's bias and mask ([B, heads, 1, capacity] for a per-head one)
    position: torch.Tensor  # long [B, 1]: the step's position ids
    slot: torch.Tensor  # long [1]: the cache slot the step's keys go to
    logn: torch.Tensor  # float32 [B, 1, 1, 1]: each row's log-n factor this step (a plan's scale)
    kept: torch.Tensor | None = None  # long [B, C]: a keep's positions (`plan.Keep`)
    hidden: torch.Tensor | None = None  # float32 [B, 1, 1, C]: -inf at a keep's slots that name no key

    def copied_to(self, device: torch.device) -> "Fixed":
        return Fixed(*(None if t is None else t.to(device, copy=True)
                       for t in (self.mask, self.biased, self.position, self.slot, self.logn, self.kept, self.hidden)))

    def refresh(self, source: "Fixed", biased: bool) -> None:
        """What a pass reads, copied from the first device's tensors (a biased pass can leave
        some layers unbiased, so it reads both masks)."""
        self.mask.copy_(source.mask)
        if biased:
            self.biased.copy_(source.biased)
        self.position.copy_(source.position)
        self.slot.copy_(source.slot)
        self.logn.copy_(source.logn)
        for mine, theirs in ((self.kept, source.kept), (self.hidden, source.hidden)):
            if mine is not None and theirs is not None:
                mine.copy_(theirs)


@dataclass(kw_only=True)
class StaticState(DecodeState):
    """A `DecodeState` on a `SlotCache`, with the fixed tensors its captured passes read.

    Rows need no `valid` here: pads and empty slots are -inf in `mask`.
    """

    cache: SlotCache
    mask: torch.Tensor  # float32 [B, 1, 1, capacity]
    biased: torch.Tensor  # mask plus the step's bias and mask ([B, heads, 1, capacity] for a per-head one)
    ids: torch.Tensor  # long [B, 1]: the step's tokens
    position: torch.Tensor  # long [B, 1]: their position ids
    slot: torch.Tensor  # long [1]: the cache slot they are written to
    next_position: torch.Tensor  # long [B]
    logn: torch.Tensor  # float32 [B, 1, 1, 1]: each row's log-n factor this step
    kept: torch.Tensor | None = None  # long [B, C]: the step's kept key positions (a plan's keep)
    hidden: torch.Tensor | None = None  # float32 [B, 1, 1, C]: -inf at the kept slots that name no key
    opened: int | None = None  # the step whose slot, mask column and positions are set (`open`)
    graphs: dict = field(default_factory=dict)
    # a split model's later devices: part -> copies of mask, biased, position and slot there
    copies: dict[int, Fixed] = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)  # (pass, part) -> the residual stream a segment starts from

    def __post_init__(self) -> None:
        self.cache.slot = self.slot

    def fixed(self, part: int, device: torch.device) -> Fixed:
        """The fixed tensors on part `part` of a split (part 0: this state's own)."""
        own = Fixed(self.mask, self.biased, self.position, self.slot, self.logn, self.kept, self.hidden)
        if part == 0:
            return own
        if part not in self.copies:
            self.copies[part] = own.copied_to(device)
        return self.copies[part]

    def fixed_for_pass(self, part: int, device: torch.device, biased: bool) -> Fixed:
        """`fixed(part, device)` as a pass reads it: a later part's copies refreshed from the first's."""
        fixed = self.fixed(part, device)
        if part:
            fixed.refresh(self.fixed(0, device), biased)
        return fixed

    @classmethod
    def of(cls, state: DecodeState) -> "StaticState":
        """Decoding buffers for a state prefilled into a SlotCache (pads stay masked)."""
        cache = state.cache
        assert isinstance(cache, SlotCache)
        keys = cache.keys(0)
        batch, device = keys.shape[0], keys.device
        mask = torch.full((batch, 1, 1, cache.capacity), -torch.inf, device=device)
        mask[..., : state.n_keys] = 0.0
        next_position = state.next_position
        if state.valid is not None:
            mask[..., : state.n_keys].masked_fill_(~state.valid[:, None, None, :], -torch.inf)
        if next_position is None:
            next_position = torch.full((batch,), state.n_keys, dtype=torch.long, device=device)
        return cls(cache=cache, n_keys=state.n_keys, mask=mask, biased=torch.empty_like(mask),
                   ids=torch.zeros(batch, 1, dtype=torch.long, device=device),
                   position=torch.zeros(batch, 1, dtype=torch.long, device=device),
                   slot=torch.zeros(1, dtype=torch.long, device=device), next_position=next_position,
                   logn=torch.ones(batch, 1, 1, 1, device=device))

    def bias_rows(self, rows: int) -> None:
        """`biased` with `rows` rows per batch row (1: shared by the heads; heads: per head); a new
        shape drops the captured passes (they point at the old tensor)."""
        if self.biased.shape[1] != rows:
            self.biased = self.mask.new_empty(self.mask.shape[0], rows, 1, self.mask.shape[-1])
            self.graphs, self.copies, self.inputs = {}, {}, {}

    def keep(self, positions: torch.Tensor, valid: torch.Tensor) -> None:
        """The step's kept keys into their fixed tensors; a new capacity drops the captured passes
        (they point at the old tensors)."""
        if self.kept is None or self.kept.shape != positions.shape:
            self.kept = torch.zeros(positions.shape, dtype=torch.long, device=self.mask.device)
            self.hidden = self.mask.new_zeros(positions.shape[0], 1, 1, positions.shape[1])
            self.graphs, self.copies, self.inputs = {}, {}, {}
        assert self.hidden is not None
        self.kept.copy_(positions)
        self.hidden.copy_(torch.where(valid, 0.0, -torch.inf)[:, None, None, :])

    def advance(self, n: int = 1) -> None:
        self.n_keys += n
        self.next_position = self.next_position + n

    def open(self, n: int) -> None:
        """The fixed inputs of the step that writes slot `n`, but its tokens: the slot, its key
        visible in `mask`, the rows' position ids. A step opens the next one's right after its
        own pass is queued: at batch 1 the device then sets them behind the pass, instead of
        waiting after it while the host launches them one by one (about 30 us each)."""
        self.mask[..., n] = 0.0
        self.slot.fill_(n)
        self.position.copy_(self.next_position[:, None])
        self.opened = n

    def reserve(self, n_keys: int) -> None:
        """Room for n_keys keys; growing the buffers drops the captured passes (they point at the old ones)."""
        cache = self.cache
        if n_keys <= cache.capacity:
            return
        capacity = capacity_for(max(n_keys, cache.capacity + cache.capacity // 4))
        self.cache = cache.resized(capacity, self.n_keys)
        mask = torch.full_like(self.mask[..., :1], -torch.inf).expand(*self.mask.shape[:3], capacity).clone()
        mask[..., : self.n_keys] = self.mask[..., : self.n_keys]
        self.mask, self.biased = mask, mask.new_empty(*self.biased.shape[:3], capacity)
        self.cache.slot = self.slot
        self.opened = None  # the copy covers the keys written, not an opened slot
        self.graphs, self.copies, self.inputs = {}, {}, {}

    def clone(self) -> "StaticState":
        return StaticState(cache=self.cache.resized(self.cache.capacity, self.n_keys), n_keys=self.n_keys,
                           mask=self.mask.clone(), biased=torch.empty_like(self.mask), ids=self.ids.clone(),
                           position=self.position.clone(), slot=self.slot.clone(),
                           next_position=self.next_position.clone(), logn=self.logn.clone())


@dataclass
class StaticControl(AttentionControl):
    """A decoding pass over the whole buffers; `slot` places sliding windows."""

    slot: torch.Tensor | None = None
    decode_attention: str = DEFAULT_DECODE_ATTENTION
    # layer -> the heads read there, as ints (a device tensor cannot be read during a capture)
    read_lists: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # device -> the masks of the pass there, chosen per layer as the fused decoder does (a model
    # split over devices reads each device's own copies)
    steps: dict[torch.device, DecodePass] = field(default_factory=dict)


def static_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     dysco_control: AttentionControl | None = None, **kwargs):
    """Decoding passes of the static backend; everything else (prefill) is `dysco_attention`."""
    ctl = dysco_control
    if not isinstance(ctl, StaticControl):
        return dysco_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                               dysco_control=ctl, **kwargs)
    if query.shape[2] != 1:
        raise ValueError("static decoding passes take one token per row")
    query, scale = scaled(query, scaling if scaling is not None else query.shape[-1] ** -0.5, ctl.scale,
                          module.layer_idx, ctl.scale_heads.get(module.layer_idx), ctl.logn)
    groups = getattr(module, "num_key_value_groups", 1)
    mask, kind = attention_mask, ctl.decode_attention
    window = getattr(module, "sliding_window", None)
    layer, heads = module.layer_idx, ctl.read_lists.get(module.layer_idx)
    step = ctl.steps[query.device] if ctl.steps else None
    if step is not None:
        mask, _ = step.masks(layer, query.dtype, {"mask": attention_mask})
        if layer in step.keep_layers:  # only the kept keys and values are read
            assert step.kept is not None and step.hidden is not None
            if heads is not None:  # except by a read, which covers every key
                ctl.rows[layer], heads = every_key_rows(query, key, mask, scale, groups, heads, window, ctl.slot), None
            key, value, mask = gather_kept(key, value, mask, step.kept, step.hidden)
            if window is not None:  # kept keys at or before slot - window are out of a sliding layer's reach
                assert ctl.slot is not None
                old = step.kept <= ctl.slot.to(key.device) - window
                mask, window, kind = mask.masked_fill(old[:, None, None, :], -torch.inf), None, "float32"
    out, rows = attend_one_query(query, key, value, mask, scale, groups, kind, heads, window, ctl.slot)
    if rows is not None:
        ctl.rows[layer] = rows
    return out, None


AttentionInterface.register(ATTN_IMPLEMENTATION, static_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)  # prefill; decoding passes bring their 4D mask


@contextlib.contextmanager
def layers_from(decoder: torch.nn.Module, start: int) -> Iterator[None]:
    """While open, the decoder runs only its layers `start`.. (on the hidden state it is given)."""
    layers = decoder.layers
    decoder.layers = torch.nn.ModuleList(list(layers)[start:])
    try:
        yield
    finally:
        decoder.layers = layers


@dataclass(frozen=True)
class StaticOptions(BackendOptions):
    """The static backend's options.

    Args:
        decode_attention: "sdpa" (fused, the default) or "float32" (the reference), see the module
            docstring.
        compile_kernels: compile the fused decoder's small operations, for decoding steps and
            for prefill's full chunks (None: on CUDA devices; False: they run as written; True
            elsewhere is a ConfigError when the backend is made). The first use of each shape in
            a process compiles it: seconds, once per process and batch size. Prefill compiles
            only from a process's second prefill of a batch size on (`fused_decoder.PREFILLED`),
            so a process that prefills once never waits for it.
        matvec: a decoding step's products of its rows (one, or a batch's up to 16; float32
            only one) through the Triton kernels of `backends.matvec`, the norm before each, the
            residual add after and the MLP's activation folded in (None: with the compiled
            kernels; False: cuBLAS, as every product of more rows, and those steps as compiled
            kernels of their own; True on a CPU is a ConfigError). Without Triton it falls back
            to cuBLAS.
    """

    decode_attention: str = DEFAULT_DECODE_ATTENTION
    compile_kernels: bool | None = None
    matvec: bool | None = None

    def __post_init__(self) -> None:
        check_decode_attention(self.decode_attention)
        for name in ("compile_kernels", "matvec"):
            given = getattr(self, name)
            if given is not None and not isinstance(given, bool):
                raise ConfigError(f"{name} is True, False or None, got {given!r}")

    def store_settings(self) -> dict:
        # the default is left out, so stores made before the option existed stay resumable; compiled
        # kernels give the eager tokens, so they are no setting
        return {} if self.decode_attention == DEFAULT_DECODE_ATTENTION else {"decode_attention": self.decode_attention}

    def described(self, backend: Backend) -> dict:
        assert isinstance(backend, StaticBackend)
        decoder = backend.decoder
        return {"decode_attention": backend.decode_attention, "written_out_decoder": decoder is not None,
                "compiled_kernels": decoder is not None and decoder.compiled,
                "triton_matvec": decoder is not None and decoder.kernels.matvec is folded and has_triton()}


class StaticBackend(Backend):
    """SDPA prefill into fixed buffers; decoding passes captured as CUDA graphs on a GPU.

    `graphs=None` captures on CUDA devices and runs eagerly elsewhere; `options`: `StaticOptions`
    (`make_backend` and `BackendSpec` also take its fields as keywords).
    """

    name = "static"
    Options = StaticOptions
    max_batch = None
    supports_graphs = True
    runs_keep = True

    def __init__(self, model: LoadedModel, *, graphs: bool | None = None, hooks: Sequence[Hook] = (),
                 options: StaticOptions | None = None, tau: float | None = None):
        super().__init__(model, graphs=graphs, hooks=hooks, tau=tau)
        self.options = chosen = StaticOptions() if options is None else options
        self.decode_attention, compile_kernels = chosen.decode_attention, chosen.compile_kernels
        on_cuda = model.device.type == "cuda"
        if graphs and not on_cuda:
            raise ConfigError("CUDA graphs need a CUDA device")
        if compile_kernels and not on_cuda:
            raise ConfigError("compiled decoding kernels need a CUDA device")
        if chosen.matvec and not on_cuda:
            raise ConfigError("the Triton matrix-vector kernel needs a CUDA device")
        self.hf = twin(model, ATTN_IMPLEMENTATION)
        compile_kernels = on_cuda if compile_kernels is None else compile_kernels
        kernels = Kernels.compiled() if compile_kernels else EAGER
        if chosen.matvec is not None:
            kernels = replace(kernels, matvec=folded if chosen.matvec else None)
        self.decoder = None if unsupported(self.hf) else FusedDecoder(self.hf, kernels, model.layout)
        # a graph is captured on one device: a split model's transformers forward crosses devices
        # inside one pass, while the written-out decoder's segments are captured one by one
        whole_pass_only = model.layout.split and self.decoder is None
        if graphs and whole_pass_only:
            raise ConfigError(f"CUDA graphs of a model split over devices need the written-out decoder: "
                              f"{unsupported(self.hf)}; pass graphs=False")
        self.graphs = on_cuda and not whole_pass_only if graphs is None else graphs
        # plan -> its biased heads' and its scaled heads' `head_masks`, made before any capture
        self.head_masks: dict[PassPlan, tuple[dict[int, torch.Tensor], ...]] = {}

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, valid: torch.Tensor | None, *, chunk_size: int | None = None,
                reserve: int = 0, scale: Scale | None = None) -> StaticState:
        """`chunk_size=None`: `CUDA_PREFILL_CHUNK` tokens a chunk for the fused decoder on a GPU,
        `runtime.DEFAULT_CHUNK` otherwise."""
        scale = self.prefill_scale(scale)
        empty = DecodeState(SlotCache(self.model.spec.n_layers, capacity_for(ids.shape[1] + reserve)), 0)
        if self.decoder is None or valid is not None:
            return StaticState.of(prefill_into(self.hf, self.model, empty, ids, valid,
                                               runtime.chunk_or_default(chunk_size), scale))
        if chunk_size is None:
            chunk_size = CUDA_PREFILL_CHUNK if self.model.device.type == "cuda" else runtime.DEFAULT_CHUNK
        runtime.check_chunk_size(chunk_size)
        self.model.check_fits(ids.shape[1])
        spec = self.model.spec
        empty.cache.allocate(ids.shape[0], spec.n_kv_heads, self.decoder.head_dim, self.model.dtype,
                             self.model.layout.layer_device)
        self.decoder.prefill(ids.to(self.model.device), empty.cache.update, chunk_size, scale)
        empty.n_keys = ids.shape[1]
        return StaticState.of(empty)

    @staticmethod
    def _static(state: DecodeState) -> StaticState:
        if not isinstance(state, StaticState):
            raise ConfigError("the static backend decodes states it prefilled itself")
        return state

    def _decode_pass(self, plan: PassPlan, fixed: Fixed) -> DecodePass:
        bias, scale = plan.additive, plan.scale
        if plan not in self.head_masks:
            self.head_masks[plan] = tuple(head_masks(part, self.model.spec.n_heads, self.model.layout.layer_device)
                                          for part in (bias, scale))
        bias_heads, scale_heads = self.head_masks[plan]
        return DecodePass(fixed.mask, fixed.slot, scale=scale, logn=fixed.logn if scale and scale.log_n else None,
                          scale_heads={layer: c.to(fixed.mask.device) for layer, c in scale_heads.items()},
                          decode_attention=self.decode_attention, read=plan.read_heads(),
                          biased=fixed.biased if bias is not None else None,
                          bias_layers=frozenset(bias.layers) if bias is not None else frozenset(),
                          bias_heads={layer: g.to(fixed.mask.device) for layer, g in bias_heads.items()},
                          kept=fixed.kept, hidden=fixed.hidden,
                          keep_layers=frozenset(plan.keep.layers) if plan.keep is not None else frozenset())

    def _pass(self, state: StaticState, plan: PassPlan, start: int, stop: int, hidden: torch.Tensor | None = None):
        """Run (or replay) layers start..stop-1 of `plan`'s pass: from the step's tokens (`start` 0)
        or `hidden`; returns the logits (on the model's device) when `stop` ends the model, else the
        residual stream, and the rows read."""
        if self.decoder is not None:
            return self._fused_pass(state, plan, start, stop, hidden)
        n_layers = self.model.spec.n_layers

        def run():
            # each device of a split gets its own copies of the fixed tensors, as the fused passes do
            steps: dict[torch.device, DecodePass] = {}
            for part, device in enumerate(self.model.layout.devices):
                fixed = state.fixed_for_pass(part, device, plan.bias is not None)
                steps.setdefault(fixed.mask.device, self._decode_pass(plan, fixed))
            step = steps[state.mask.device]
            ctl = StaticControl(scale=plan.scale, scale_heads=dict(step.scale_heads), logn=step.logn,
                                slot=state.slot, decode_attention=self.decode_attention,
                                read_lists=plan.read_heads(), steps=steps)
            inputs = {"input_ids": state.ids} if start == 0 else {"inputs_embeds": hidden}
            with self._layers(start, stop):
                try:
                    out = self.hf(**inputs, attention_mask=state.mask, position_ids=state.position,
                                  past_key_values=state.cache, use_cache=True, logits_to_keep=1, dysco_control=ctl)
                except StopForward as stop_:
                    return stop_.hidden, ctl.rows
            if stop < n_layers:
                raise RuntimeError(f"the pass did not stop after layer {stop - 1}")
            return out.logits[:, -1].float(), ctl.rows

        out, rows = self._replay(state, (plan, start, stop, 0), self.model.device, run)
        if stop < n_layers:  # a later segment's graph reads this very tensor
            return out, rows
        return out.to(self.model.device, copy=True), rows

    def _replay(self, state: StaticState, key: tuple, device: torch.device, run):
        """`run()`, or without graphs: captured on `device` the first time, replayed after (its
        outputs are the same tensors at every replay)."""
        if not self.graphs:
            return run()
        key = (self, *key, self.decode_attention)
        with torch.cuda.device(device):
            if key not in state.graphs:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # lazy initialisations happen outside the capture
                    run()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                # a stream of this device: torch.cuda.graph's shared default one belongs to the
                # device of the first capture
                with torch.cuda.graph(graph, stream=torch.cuda.Stream(device)):
                    outputs = run()
                state.graphs[key] = (graph, outputs)
            graph, outputs = state.graphs[key]
            graph.replay()
        return outputs

    def _fused_pass(self, state: StaticState, plan: PassPlan, start: int, stop: int, hidden: torch.Tensor | None):
        """The pass through the written-out decoder, one captured graph per device of a split:
        each later device starts from a fixed copy of the residual stream the one before left."""
        decoder = self.decoder
        assert decoder is not None
        placement, n_layers = decoder.placement, decoder.n_layers
        # biasing only the last layers can leave a segment with just the final norm, on the last device
        segments = placement.segments(start, stop) or [(placement.parts[-1], stop, stop)]
        biased = plan.bias is not None
        rows: dict[int, torch.Tensor] = {}
        x = hidden
        for index, (part, first, last) in enumerate(segments):
            device = placement.devices[part]
            fixed = state.fixed_for_pass(part, device, biased)
            inbox = None  # the first segment from the step's tokens embeds them itself
            if x is not None:
                inbox = state.inputs.get((plan, start, part))
                if inbox is None:
                    inbox = state.inputs[(plan, start, part)] = torch.empty(x.shape, dtype=x.dtype, device=device)
                inbox.copy_(x)
            logits_here = index == len(segments) - 1 and stop == n_layers and decoder.lm_device == device
            x, seg_rows = self._replay(state, (plan, start, stop, part), device, functools.partial(
                self._segment, state, plan, fixed, inbox, first, last, logits_here))
            rows.update(seg_rows)
        assert x is not None
        if stop < n_layers:
            return x, rows
        logits = x if decoder.lm_device == placement.devices[segments[-1][0]] else decoder.logits(x)
        return logits.to(self.model.device, copy=True), rows

    def _segment(self, state: StaticState, plan: PassPlan, fixed: Fixed, x: torch.Tensor | None, first: int,
                 last: int, logits: bool) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Layers first..last-1 on one device from `x` (None: the step's tokens, embedded);
        returns the residual stream, the final norm's output at the model's end, or with
        `logits` the logits, and the rows read here."""
        assert self.decoder is not None
        step = self._decode_pass(plan, fixed)
        h = self.decoder.embed(state.ids) if x is None else x
        h, normed = self.decoder.decode(h, fixed.position, state.cache.buffers, step, first, last)
        if normed is None:
            return h, step.rows
        return (self.decoder.logits(normed) if logits else normed), step.rows

    def _layers(self, start: int, stop: int) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        if stop < self.model.spec.n_layers:
            stack.enter_context(stop_after(decoder_layers(self.hf)[stop - 1]))
        if start > 0:
            stack.enter_context(layers_from(self.hf.model, start))
        return stack

    def _load(self, state: StaticState, tokens: torch.Tensor) -> None:
        """The step's token, position and slot into the fixed tensors; its key becomes visible."""
        n = state.n_keys
        self.model.check_fits(n + 1)
        state.reserve(n + 1)
        if state.opened != n:
            state.open(n)
        state.ids.copy_(tokens.to(state.ids.device).view(-1, 1))

    @staticmethod
    def _set_bias(state: StaticState, bias: torch.Tensor) -> None:
        state.bias_rows(bias.shape[1])
        state.biased.copy_(state.mask.expand_as(state.biased))
        state.biased[..., : bias.shape[-1]] += bias.to(state.biased.device)

    @torch.inference_mode()
    def run(self, state: DecodeState, tokens: torch.Tensor, plan: PassPlan) -> StepOutput:
        plan = self.checked(plan)
        state = self._static(state)
        n_keys, batch, n_layers = state.n_keys + 1, tokens.shape[0], self.model.spec.n_layers
        stop = plan.last_layer(n_layers) + 1
        self._load(state, tokens)
        if plan.scale is not None and plan.scale.log_n is not None:
            state.logn.copy_(logn_factor(state.next_position + 1, plan.scale.log_n).view(-1, 1, 1, 1))
        given = self.given_bias(plan, batch, n_keys)
        if given is not None:
            self._set_bias(state, given)
        kept = self.given_keep(plan, batch, n_keys)
        if kept is not None:
            state.keep(*kept)
        if plan.bias is not None and given is None:  # a rule: the layers before its first biased one, then the rest
            split = plan.bias.layers[0]
            hidden, rows = self._pass(state, plan, 0, split)
            first = read_outs(plan, rows, n_keys, self.model.device, left=True, first_only=True)
            self._set_bias(state, self.ruled_bias(plan, first[0], batch, n_keys))
            out, later = self._pass(state, plan, split, stop, hidden)
            rows = {**rows, **later}
        else:
            out, rows = self._pass(state, plan, 0, stop)
        self.watch_given()  # behind the pass: the device runs them after it, not waits for them before
        if plan.write_cache:
            state.advance()
            if state.n_keys < state.cache.capacity:
                state.open(state.n_keys)
        reads = read_outs(plan, rows, n_keys, self.model.device, left=True) if plan.reads else ()
        return StepOutput(out if stop == n_layers else None, reads)
