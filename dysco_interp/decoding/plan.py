"""The pass plan: what one decoding forward pass does, as one frozen, hashable value.

Every backend runs plans (`Backend.run(state, tokens, plan)`), and every method, built-in or
a researcher's own, is a program of plans (`decoding/methods.py`). A plan says:
- `reads`: whose attention rows to read, any `(layer, head)`, and what to return from them:
  their mean (DySCO's relevance), each head's row, or each head's mass over given key spans;
- `stop_after`: the last layer to run (None: all of them, and the logits);
- `write_cache`: whether the token's keys and values stay in the cache;
- `bias`: an additive bias on the pre-softmax scores of some layers (and optionally only some
  of their heads): a tensor the caller gives, or one a rule builds from this pass's own first
  read once its layers have run (what "dysco-reuse" does).

Equality and hash are the plan's structure only. The data a pass carries, a given bias tensor
or a rule, are left out, so that one plan built once per run keys the static backend's CUDA
graphs and the same structure with new data replays them.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from dysco_interp.decoding.passes import PassKind
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import head_label

if TYPE_CHECKING:
    import torch

    from dysco_interp.decoding.readout import ReadOut

ReadReturns = Literal["mean", "rows", "span_mass"]
READ_RETURNS: tuple[ReadReturns, ...] = ("mean", "rows", "span_mass")


def _index(value) -> int:
    """An integer as given; TypeError for anything else. `int()` would turn 1.7 into layer 1 and
    "2" into layer 2 without a word, and True into layer 1."""
    if isinstance(value, bool):
        raise TypeError("a bool is not an index")
    return operator.index(value)


def head_pairs(heads: Iterable, what: str) -> tuple[tuple[int, int], ...]:
    """`heads` as sorted, distinct `(layer, head)` pairs; a ConfigError naming `what` for anything
    that is no non-empty collection of integer pairs."""
    try:
        pairs = sorted({(_index(layer), _index(head)) for layer, head in heads})
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be (layer, head) pairs of integers") from None
    if not pairs:
        raise ConfigError(f"{what} is empty")
    return tuple(pairs)


def _layers(layers: Iterable[int]) -> tuple[int, ...]:
    try:
        out = tuple(sorted({_index(layer) for layer in layers}))
    except (TypeError, ValueError):
        raise ConfigError("a bias's layers must be integers (a range or a set)") from None
    if not out:
        raise ConfigError("a bias needs at least one layer: its layer set is empty")
    return out


@dataclass(frozen=True, init=False)
class Read:
    """Attention rows to read in a pass: the last query's softmax row of each `(layer, head)`.

    `returns`: "mean" (the mean row over the heads, on absolute key positions: DySCO's read),
    "rows" (also each head's row, `[B, heads, n_keys]`) or "span_mass" (also each head's mass
    over `spans`, `[B, heads, len(spans)]`; spans are `[start, end)` key positions).
    Only the last query's row is computed, never a whole pattern.
    """

    heads: tuple[tuple[int, int], ...]
    returns: ReadReturns
    spans: tuple[tuple[int, int], ...]

    def __init__(self, heads: Iterable[tuple[int, int]], returns: ReadReturns = "mean",
                 spans: Iterable[tuple[int, int]] = ()):
        object.__setattr__(self, "heads", head_pairs(heads, "a read's head set"))
        if returns not in READ_RETURNS:
            raise ConfigError(f"a read returns one of {', '.join(READ_RETURNS)}, not {returns!r}")
        object.__setattr__(self, "returns", returns)
        spans = tuple((int(s), int(e)) for s, e in spans)
        if returns == "span_mass" and not spans:
            raise ConfigError("a span_mass read needs spans")
        for s, e in spans:
            if not 0 <= s < e:
                raise ConfigError(f"span ({s}, {e}) is not a [start, end) range of key positions")
        object.__setattr__(self, "spans", spans)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted({layer for layer, _ in self.heads}))

    @property
    def max_layer(self) -> int:
        return self.heads[-1][0]

    def by_layer(self) -> dict[int, tuple[int, ...]]:
        """layer -> the query heads read there, ascending."""
        out: dict[int, list[int]] = {}
        for layer, head in self.heads:
            out.setdefault(layer, []).append(head)
        return {layer: tuple(hs) for layer, hs in out.items()}


BiasRule = Callable[["ReadOut"], "torch.Tensor"]


@dataclass(frozen=True, init=False)
class Bias:
    """An additive bias on the pre-softmax attention scores.

    Args:
        layers: the layers it applies to (a range or a set; not empty).
        heads: only these `(layer, head)` pairs of those layers (None: every head).
        source: "tensor" (the caller's `values`) or "rule" (`rule(read)` on the pass's first
            read, run once that read's layers are done; every biased layer must come after them).
        values: float32 `[B, 1, 1, n_keys]` on absolute key positions (the token's own key last).
        rule: `ReadOut -> [B, 1, 1, n_keys]`.
    """

    layers: tuple[int, ...]
    heads: tuple[tuple[int, int], ...] | None
    source: Literal["tensor", "rule"]
    values: torch.Tensor | None = field(compare=False, repr=False)
    rule: BiasRule | None = field(compare=False, repr=False)

    def __init__(self, layers: Iterable[int], heads: Iterable[tuple[int, int]] | None = None,
                 source: Literal["tensor", "rule"] = "tensor", values: torch.Tensor | None = None,
                 rule: BiasRule | None = None):
        object.__setattr__(self, "layers", _layers(layers))
        pairs = None if heads is None else head_pairs(heads, "a bias's head set")
        outside = [head_label(layer, h) for layer, h in pairs or () if layer not in self.layers]
        if outside:
            raise ConfigError(f"bias heads {', '.join(outside)} are in layers the bias does not apply to")
        if source not in ("tensor", "rule"):
            raise ConfigError(f"a bias's source is 'tensor' or 'rule', not {source!r}")
        for name, value in (("heads", pairs), ("source", source), ("values", values), ("rule", rule)):
            object.__setattr__(self, name, value)

    def heads_in(self, layer: int) -> tuple[int, ...] | None:
        """The query heads biased in `layer` (None: all of them)."""
        if self.heads is None:
            return None
        return tuple(h for l_, h in self.heads if l_ == layer)

    def given(self, values: torch.Tensor) -> "Bias":
        return dataclasses.replace(self, values=values)

    def ruled_by(self, rule: BiasRule) -> "Bias":
        return dataclasses.replace(self, rule=rule)


@dataclass(frozen=True)
class PassPlan:
    """One decoding forward pass (see the module docstring)."""

    reads: tuple[Read, ...] = ()
    stop_after: int | None = None
    write_cache: bool = True
    bias: Bias | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "reads", tuple(self.reads))
        if self.stop_after is not None and self.write_cache:
            raise ConfigError("a pass that stops early cannot write the cache: the later layers' keys would be missing")
        if self.bias is not None and self.bias.source == "rule":
            if not self.reads:
                raise ConfigError("a bias built by a rule needs a read in the same pass")
            first = self.reads[0].max_layer
            early = [layer for layer in self.bias.layers if layer <= first]
            if early:
                raise ConfigError(f"a rule's bias can only apply after the read it is built from (layer {first}); "
                                  f"it names layer(s) {', '.join(map(str, early))}")
        if self.stop_after is not None:
            deep = [r.max_layer for r in self.reads if r.max_layer > self.stop_after]
            if deep:
                raise ConfigError(f"the pass stops after layer {self.stop_after} but reads layer {max(deep)}")

    @property
    def kind(self) -> PassKind:
        """What `passes.current_pass().kind` calls it."""
        if self.stop_after is not None:
            return "partial"
        if self.bias is None:
            return "plain"
        return "reuse" if self.bias.source == "rule" else "biased"

    def last_layer(self, n_layers: int) -> int:
        return n_layers - 1 if self.stop_after is None else self.stop_after

    def read_heads(self) -> dict[int, tuple[int, ...]]:
        """layer -> the query heads any read of the pass needs there, ascending."""
        out: dict[int, set[int]] = {}
        for read in self.reads:
            for layer, head in read.heads:
                out.setdefault(layer, set()).add(head)
        return {layer: tuple(sorted(hs)) for layer, hs in sorted(out.items())}

    def with_read(self, read: Read) -> "PassPlan":
        return dataclasses.replace(self, reads=(*self.reads, read))

    def with_bias(self, values: torch.Tensor) -> "PassPlan":
        """The same plan carrying this step's bias tensor."""
        if self.bias is None or self.bias.source != "tensor":
            raise ConfigError("this plan has no tensor bias to give values to")
        return dataclasses.replace(self, bias=self.bias.given(values))

    def check(self, n_layers: int, n_heads: int) -> "PassPlan":
        """This plan if it fits a model of `n_layers` x `n_heads`; else a ConfigError naming what does not."""
        if self.stop_after is not None and not 0 <= self.stop_after < n_layers:
            raise ConfigError(f"stop_after={self.stop_after} is outside the model's {n_layers} layers")
        pairs = [p for read in self.reads for p in read.heads]
        if self.bias is not None:
            wide = [layer for layer in self.bias.layers if not 0 <= layer < n_layers]
            if wide:
                raise ConfigError(f"bias layer {wide[0]} is outside the model's {n_layers} layers")
            if self.stop_after is not None and self.bias.layers[-1] > self.stop_after:
                raise ConfigError(f"the pass stops after layer {self.stop_after} but biases layer "
                                  f"{self.bias.layers[-1]}")
            pairs += list(self.bias.heads or ())
        for layer, head in pairs:
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise ConfigError(f"head {head_label(layer, head)} is outside the model "
                                  f"({n_layers} layers x {n_heads} heads)")
        return self


def plain(read: Read | None = None) -> PassPlan:
    """The whole model, cache written, no bias (optionally reading)."""
    return PassPlan(reads=() if read is None else (read,))


def check_bias_values(values: torch.Tensor, batch: int, n_keys: int) -> torch.Tensor:
    """A given or ruled bias of the right shape, as float32. Its values are checked by
    `bias_fault`, which never waits for the device."""
    import torch

    if not isinstance(values, torch.Tensor):
        raise ConfigError(f"a bias is a tensor, got {type(values).__name__}")
    if values.ndim != 4 or values.shape[1:3] != (1, 1) or values.shape[0] not in (1, batch) \
            or values.shape[-1] != n_keys:
        raise ConfigError(f"a bias must be [batch, 1, 1, n_keys] = [{batch}, 1, 1, {n_keys}], "
                          f"got {list(values.shape)}")
    return values.float()


# The largest finite bias a plan may add. Attention scores are tens at most, so 1e4 already
# decides any softmax; far beyond it, score + bias overflows (3e38 is finite, twice it is not)
# and softmax is undefined, which backends then answer differently.
MAX_BIAS = 1e4

# What `bias_fault` flags, one bit each, and how `bias_fault_message` words it.
_FAULTS = (
    "holds NaN or +inf",
    f"holds a finite value beyond +-{MAX_BIAS:g}",
    "leaves some row no finite key (-inf on every key, the token's own included)",
)


def bias_fault(values: torch.Tensor) -> torch.Tensor:
    """An int device tensor whose bits say what is wrong with a bias (0: nothing); see `_FAULTS`.
    A -inf masks a key, which is fine as long as every row keeps one key it can attend to."""
    import torch

    finite = torch.isfinite(values)
    broken = (torch.isnan(values) | torch.isposinf(values)).any()
    huge = (finite & (values.abs() > MAX_BIAS)).any()
    empty = (~finite.flatten(1).any(dim=1)).any()
    return broken.int() | (huge.int() << 1) | (empty.int() << 2)


def bias_fault_message(fault: int) -> str:
    """One line for the bits `bias_fault` set."""
    what = [text for bit, text in enumerate(_FAULTS) if fault >> bit & 1]
    return f"a bias {'; it '.join(what)}: its rule or its tensor is broken"
