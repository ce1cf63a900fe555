"""The interface every decoding backend implements, and the state it decodes on.

The decode loop (`decoding/loop.py`) needs four operations on a prefilled `DecodeState`, each
feeding one token per row:
- `step(state, tokens, bias=None, read=False)`: the full model, cache written; with `read`,
  the QRHeads' attention (unbiased passes only); with `bias`, log(beta) on the selected keys;
- `partial(state, tokens)`: layers 0..L* (the deepest QRHead layer), no bias, nothing kept
  in the cache; the QRHeads' attention;
- `reuse_step(state, tokens, select_bias)`: one pass that writes the cache; after layer L*,
  `select_bias(attention)` turns that layer's read into the bias of layers L*+1.. ("dysco-reuse");
- `prefill(ids, valid, chunk_size=, reserve=)`: the prompt into a fresh state (UniAttnS's
  temperature included); `reserve` tokens will be decoded after it.
All four return a `StepOutput`. A bias is `relevance.scaling_bias` on absolute key positions,
float32 `[B, 1, 1, n_keys]`; an attention read is float32 `[B, n_keys]`, the mean over the
QRHeads of their rows, and sums to 1.

Passes that need only the first layers end with `StopForward`, raised by a forward hook on the
deepest layer they need (`stop_after`): the one early-stop mechanism of the HF-based backends.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from transformers.cache_utils import Cache

from dysco_interp.decoding import runtime
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import Hook
from dysco_interp.models import LoadedModel

SelectBias = Callable[[torch.Tensor], torch.Tensor]


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

    logits: torch.Tensor | None = None  # float32 [B, vocab] of the token fed; None for a partial pass
    attention: torch.Tensor | None = None  # float32 [B, n_keys]: the QRHeads' read, when one was made


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


def no_hooks_message(backend: str) -> str:
    return (f"hooks run only where the TransformerLens bridge runs: pass backend='bridge' (the {backend} "
            "backend runs the SDPA twin, which has no hook points)")


class Backend(ABC):
    """Where DySCO's passes run. Construct through `backends.make_backend`.

    Args:
        model: the loaded model.
        heads: the QRHeads whose attention `read`, `partial` and `reuse_step` report; None for
            methods that read none.
        tau: UniAttnS's attention temperature in every head (1.0: none).
        graphs: capture decoding passes as CUDA graphs (None: where the backend can).
        hooks: the user's TransformerLens forward hooks `(name or filter, fn)`, run in every
            pass after the method's own; only a backend with hook points takes them.
    """

    name: ClassVar[str]
    max_batch: ClassVar[int | None]  # rows decoded together at most (None: any)
    supports_graphs: ClassVar[bool] = False
    runs_hooks: ClassVar[bool] = False  # its passes go through the bridge's hook points

    def __init__(self, model: LoadedModel, heads: HeadSet | None, *, tau: float = 1.0, graphs: bool | None = None,
                 hooks: Sequence[Hook] = ()):
        if graphs and not self.supports_graphs:
            raise ConfigError(f"the {self.name} backend does not capture CUDA graphs; use backend='static'")
        if hooks and not self.runs_hooks:
            raise ConfigError(no_hooks_message(self.name))
        self.user_hooks: list[Hook] = list(hooks)
        self.model = model
        self.heads = heads
        self.tau = float(tau)

    def needs_heads(self) -> None:
        if self.heads is None:
            raise ConfigError(f"the {self.name} backend was built without QRHeads; it cannot read attention")

    @staticmethod
    def check_step(bias: torch.Tensor | None, read: bool) -> None:
        # a read under a bias would report the rescaled attention, which no method wants
        if bias is not None and read:
            raise ConfigError("a decoding step reads the QRHeads' attention in unbiased passes only")

    @abstractmethod
    def prefill(self, ids: torch.Tensor, valid: torch.Tensor | None, *, chunk_size: int | None = None,
                reserve: int = 0) -> DecodeState:
        """The prompt `ids` `[B, n]` (left-padded where `valid` `[B, n]` is False) into a fresh state,
        `chunk_size` tokens at a time (None: the backend's choice, `runtime.DEFAULT_CHUNK` unless it
        says otherwise)."""

    @abstractmethod
    def step(self, state: DecodeState, tokens: torch.Tensor, *, bias: torch.Tensor | None = None,
             read: bool = False) -> StepOutput:
        """One token per row (`tokens` `[B]`) through the whole model; the cache keeps its key."""

    @abstractmethod
    def partial(self, state: DecodeState, tokens: torch.Tensor) -> StepOutput:
        """Layers 0..L* without bias; the cache is left as it was. Returns the QRHeads' attention."""

    @abstractmethod
    def reuse_step(self, state: DecodeState, tokens: torch.Tensor, select_bias: SelectBias) -> StepOutput:
        """One pass: layers 0..L* unbiased, then `select_bias(attention)` biases layers L*+1.."""
