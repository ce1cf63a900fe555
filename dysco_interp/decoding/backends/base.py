"""The interface every decoding backend implements, and the state it decodes on.

A backend does two things:
- `prefill(ids, valid, chunk_size=, reserve=, scale=)`: the prompt into a fresh `DecodeState`
  (under the method's `plan.Scale`, if it has one: UniAttnS's temperature, log-n scaling);
  `reserve` tokens will be decoded after it;
- `run(state, tokens, plan)`: one token per row through one forward pass that the
  `plan.PassPlan` describes (its reads, where it stops, whether it writes the cache, its bias,
  mask and scale); returns a `StepOutput`. A pass that writes the cache advances the state.
Every method, built-in or a user's, is a program of such passes (`decoding/methods.py`).

Passes that need only the first layers end with `StopForward`, raised by a forward hook on the
deepest layer they need (`stop_after`): the one early-stop mechanism of the HF-based backends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from transformers.cache_utils import Cache

from dysco_interp.decoding import runtime
from dysco_interp.decoding.plan import (
    Bias,
    Mask,
    PassPlan,
    ReadOut,
    Scale,
    additive_values,
    bias_fault,
    bias_fault_message,
    check_bias_values,
    check_keep_values,
    keep_fault,
)
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import Hook
from dysco_interp.models import LoadedModel


def raise_fault(fault: int) -> None:
    """A ConfigError for the bits a backend's `take_fault` gave, if any is set."""
    if fault:
        raise ConfigError(bias_fault_message(fault))


@dataclass
class DecodeState:
    """A cache plus what rows of different lengths need: which keys are real, and positions."""

    cache: Cache
    n_keys: int  # cached tokens per row (left-padded rows count their pads)
    valid: torch.Tensor | None = None  # bool [B, n_keys]: False at left pads; None: no pads
    next_position: torch.Tensor | None = None  # long [B]: position id of each row's next token

    def advance(self, n: int = 1) -> None:
        self.n_keys += n
        if self.valid is not None and self.next_position is not None:
            self.valid = torch.nn.functional.pad(self.valid, (0, n), value=True)
            self.next_position = self.next_position + n

    def clone(self) -> "DecodeState":
        return DecodeState(runtime.clone_cache(self.cache), self.n_keys,
                           None if self.valid is None else self.valid.clone(),
                           None if self.next_position is None else self.next_position.clone())


@dataclass
class StepOutput:
    """What one pass gives back."""

    logits: torch.Tensor | None = None  # float32 [B, vocab] of the token fed; None for a pass that stops early
    reads: tuple[ReadOut, ...] = ()  # one per read of the plan, in its order

    @property
    def attention(self) -> torch.Tensor | None:
        """The first read's mean row, float32 `[B, n_keys]` (DySCO's relevance read), or None."""
        return self.reads[0].attention if self.reads else None


class StopForward(Exception):
    """Ends a forward pass after the deepest layer it needs, carrying that layer's output."""

    def __init__(self, hidden: torch.Tensor | None = None):
        super().__init__("forward pass stopped early")
        self.hidden = hidden


@contextlib.contextmanager
def stop_after(layer: torch.nn.Module) -> Iterator[None]:
    """While open, a forward through `layer` raises `StopForward` with the layer's output."""
    def stop(module, args, output):
        raise StopForward(output[0] if isinstance(output, tuple) else output)

    handle = layer.register_forward_hook(stop)
    try:
        yield
    finally:
        handle.remove()


def head_masks(part: Bias | Mask | Scale | None, n_heads: int,
               device_of: Callable[[int], torch.device]) -> dict[int, torch.Tensor]:
    """layer -> bool `[1, n_heads, 1, 1]` of the heads a plan's bias, mask or scale touches there,
    for a part limited to some heads (empty: it touches every head of its layers, or there is no
    part), each on `device_of(layer)`. Made once per plan, before any CUDA-graph capture (a captured
    pass cannot copy a host list to the device)."""
    if part is None or part.heads is None:
        return {}
    out = {}
    for layer in part.layers:
        chosen = torch.zeros(1, n_heads, 1, 1, dtype=torch.bool)
        chosen[0, list(part.heads_in(layer) or ()), 0, 0] = True
        out[layer] = chosen.to(device_of(layer))
    return out


def no_hooks_message(backend: str) -> str:
    return (f"hooks run only where the TransformerLens bridge runs: pass backend='bridge' (the {backend} "
            "backend runs the SDPA twin, which has no hook points)")


@dataclass(frozen=True)
class BackendOptions:
    """A backend's own options (none here): each backend names its options class (`Backend.Options`),
    a frozen dataclass whose fields a `BackendSpec` carries and whose checks run on construction."""

    def store_settings(self) -> dict:
        """What a result store records of the options: those whose value changes the tokens."""
        return {}

    @classmethod
    def of(cls, backend: str, given: "BackendOptions | None", loose: dict) -> "BackendOptions":
        """The options for backend `backend`: `given` (an instance of this class) or built from the
        `loose` keywords; a keyword the class does not have is a ConfigError naming the backend."""
        loose = {k: v for k, v in loose.items() if v is not None}
        if given is not None:
            if not isinstance(given, cls):
                raise ConfigError(f"the {backend} backend takes options of {cls.__name__}, got {type(given).__name__}")
            if loose:
                raise ConfigError(f"give {', '.join(sorted(loose))} inside the options, not beside them")
            return given
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(loose) - names)
        if unknown:
            known = ", ".join(sorted(names)) or "none"
            raise ConfigError(f"the {backend} backend has no option {unknown[0]} (its options: {known})")
        return cls(**loose)

    def described(self, backend: "Backend") -> dict:
        """How a backend built with these options decodes, for a benchmark's record."""
        return {}


class Backend(ABC):
    """Where decoding passes run. Construct through `backends.make_backend`.

    Args:
        model: the loaded model.
        graphs: capture decoding passes as CUDA graphs (None: where the backend can).
        hooks: the user's TransformerLens forward hooks `(name or filter, fn)`, run in every
            pass after the method's own; only a backend with hook points takes them.
        tau: deprecated (a temperature is a plan's `Scale` now, the prefill's included): every
            pass and the prefill without a scale of their own get `scores / tau`.
    """

    name: ClassVar[str]
    Options: ClassVar[type[BackendOptions]] = BackendOptions  # the backend's own options
    max_batch: ClassVar[int | None]  # rows decoded together at most (None: any)
    supports_graphs: ClassVar[bool] = False
    runs_hooks: ClassVar[bool] = False  # its passes go through the bridge's hook points
    # it carries out a plan's keep (`plan.Keep`); a backend that does not is refused such a plan
    # rather than attending to every key
    runs_keep: ClassVar[bool] = False

    def __init__(self, model: LoadedModel, *, graphs: bool | None = None, hooks: Sequence[Hook] = (),
                 tau: float | None = None):
        if graphs and not self.supports_graphs:
            raise ConfigError(f"the {self.name} backend does not capture CUDA graphs; use backend='static'")
        if hooks and not self.runs_hooks:
            raise ConfigError(no_hooks_message(self.name))
        self.user_hooks: list[Hook] = list(hooks)
        self.model = model
        self.default_scale: Scale | None = None
        if tau is not None:
            warnings.warn("a backend's tau= is deprecated and goes in the next release: give passes a "
                          "plan.Scale(temperature=...) and prefill(scale=...)", DeprecationWarning, stacklevel=3)
            if tau != 1.0:
                self.default_scale = Scale(range(model.spec.n_layers), temperature=tau)
        self._checked: set[PassPlan] = set()
        # what was wrong with the biases since the last `check_faults` (`plan.bias_fault`'s bits),
        # on the device: checking each step's bias on the host would wait for the device at every step
        self._fault: torch.Tensor | None = None
        # the fault checks of the biases and keeps given since the last `watch_given`, not yet queued
        self._unwatched: list[Callable[[], torch.Tensor]] = []

    @property
    def runs_ahead(self) -> bool:
        """Whether a decode loop queues a step before it reads the last one's token: on a GPU the
        host then prepares the next pass while the device runs this one. When every row ends on
        EOS, that step is run and thrown away; the user's hooks would see it, so not with them."""
        return self.model.device.type == "cuda" and not self.user_hooks

    def checked(self, plan: PassPlan) -> PassPlan:
        """`plan` if it fits the model (checked once per structure), else a ConfigError."""
        self.watch_given()  # every pass starts here: the last pass's checks are queued by now at the latest
        if not isinstance(plan, PassPlan):
            raise ConfigError(f"a backend runs a PassPlan, got {type(plan).__name__}")
        if plan.scale is None and self.default_scale is not None:
            plan = dataclasses.replace(plan, scale=self.default_scale)
        if plan not in self._checked:
            if plan.keep is not None and not self.runs_keep:
                raise ConfigError(f"the {self.name} backend does not carry out a plan's keep (plan.Keep); "
                                  "the bridge, sdpa, static and flex backends do")
            plan.check(self.model.spec.n_layers, self.model.spec.n_heads)
            self._checked.add(plan)
        return plan

    def prefill_scale(self, scale: Scale | None) -> Scale | None:
        """The prefill's scale, checked against the model (the deprecated `tau` where none is given)."""
        if scale is None:
            return self.default_scale
        return self.checked(PassPlan(scale=scale)).scale

    def _watched(self, values: torch.Tensor) -> torch.Tensor:
        self._unwatched.append(functools.partial(bias_fault, values))
        return values

    def watch_given(self) -> None:
        """Queue the fault checks of the biases and keeps given since the last call (device work
        only, no wait). A backend that captures its passes calls it once it has queued the pass
        they feed, so that the device does not sit idle before the pass while the host launches
        these small kernels one by one; otherwise the next pass (`checked`) or `check_faults`
        queues them."""
        for fault_of in self._unwatched:
            fault = fault_of()
            self._fault = fault if self._fault is None else self._fault | fault.to(self._fault.device)
        self._unwatched = []

    def given_bias(self, plan: PassPlan, batch: int, n_keys: int) -> torch.Tensor | None:
        """The checked tensor a plan adds to the scores: its given bias and its mask's -inf
        (`plan.additive_values`; None: neither, or a bias its rule builds during the pass)."""
        values = additive_values(plan, batch, n_keys, self.model.spec.n_heads)
        return None if values is None else self._watched(values)

    def given_keep(self, plan: PassPlan, batch: int, n_keys: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A plan's kept keys, checked (`plan.keep_fault` on the device): long positions, each
        inside 0..n_keys-1 (one outside is a fault, and reads key 0 here, never out of bounds), and
        bool valid slots, `[batch, capacity]` on the model's device (None: no keep)."""
        if plan.keep is None:
            return None
        positions, valid = check_keep_values(plan.keep, batch, n_keys)
        positions, valid = positions.to(self.model.device), valid.to(self.model.device)
        self._unwatched.append(functools.partial(keep_fault, positions, valid, n_keys))
        inside = (positions >= 0) & (positions < n_keys)
        return torch.where(inside, positions, 0), valid & inside

    def ruled_bias(self, plan: PassPlan, read: ReadOut, batch: int, n_keys: int) -> torch.Tensor:
        """The bias a plan's rule builds from the pass's first read, checked."""
        assert plan.bias is not None
        if plan.bias.rule is None:
            raise ConfigError("the plan's bias has no rule: give one with Bias.ruled_by(rule)")
        n_heads = self.model.spec.n_heads if plan.bias.per_head else None
        return self._watched(check_bias_values(plan.bias.rule(read), batch, n_keys, n_heads))

    def check_faults(self) -> None:
        """A ConfigError if a bias since the last call was broken (`plan.bias_fault`); this waits for
        the device: call it where the caller waits anyway, as the decode loop does when it reads the tokens."""
        fault = self.take_fault()
        raise_fault(0 if fault is None else int(fault))

    def take_fault(self) -> torch.Tensor | None:
        """The fault bits (`plan.bias_fault`) of the biases and keeps given since the last call, as
        a device tensor, without waiting (None: none was given). A caller that reads other values
        from the device reads these in the same transfer, then passes them to `raise_fault`."""
        self.watch_given()
        fault, self._fault = self._fault, None
        return fault

    @abstractmethod
    def prefill(self, ids: torch.Tensor, valid: torch.Tensor | None, *, chunk_size: int | None = None,
                reserve: int = 0, scale: Scale | None = None) -> DecodeState:
        """The prompt `ids` `[B, n]` (left-padded where `valid` `[B, n]` is False) into a fresh state,
        `chunk_size` tokens at a time (None: the backend's choice, `runtime.DEFAULT_CHUNK` unless it
        says otherwise), its attention under `scale` (None: as the model has it)."""

    @abstractmethod
    def run(self, state: DecodeState, tokens: torch.Tensor, plan: PassPlan) -> StepOutput:
        """One token per row (`tokens` `[B]`) through the pass `plan` describes."""
