"""The pass plan: what one decoding forward pass does, as one frozen, hashable value.

Every backend runs plans (`Backend.run(state, tokens, plan)`), and every method, built-in or
a researcher's own, is a program of plans (`decoding/methods.py`). A plan says:
- `reads`: whose attention rows to read, any `(layer, head)`, and what to return from them:
  their mean (DySCO's relevance), each head's row, or each head's mass over given key spans;
- `stop_after`: the last layer to run (None: all of them, and the logits);
- `write_cache`: whether the token's keys and values stay in the cache;
- `bias`: an additive bias on the pre-softmax scores of some layers (and optionally only some
  of their heads), shared by those heads or one row per head: a tensor the caller gives, or
  one a rule builds from this pass's own first read once its layers have run ("dysco-reuse");
- `mask`: keys some layers' heads may not attend to (-inf on their scores), given per step;
- `scale`: a multiplicative change of the scores of some layers (and heads): a temperature,
  and optionally Qwen's log-n growth past a training length. A method's prefill may carry a
  scale too (UniAttnS's temperature, log-n scaling), nothing else;
- `keep`: the only keys some layers attend to, a fixed number of positions per row, given per
  step: exactly a -inf on every other key's scores, which the fast backends carry out by reading
  only those keys and values (sparse decoding). A read in a kept layer still covers every key.

What a plan cannot express: additive query or key vectors, per-head position ids, edits of the
values or of a head's output. Those are TransformerLens hooks on the bridge backend
(`docs/guide/methods.md` shows how).

Equality and hash are the plan's structure only. The data a pass carries, a given bias tensor
or a rule, are left out, so that one plan built once per run keys the static backend's CUDA
graphs and the same structure with new data replays them.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from dysco_interp.decoding.passes import PassKind
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import head_label

if TYPE_CHECKING:
    import torch

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


def _layers(layers: Iterable[int], what: str = "bias") -> tuple[int, ...]:
    try:
        out = tuple(sorted({_index(layer) for layer in layers}))
    except (TypeError, ValueError):
        raise ConfigError(f"a {what}'s layers must be integers (a range or a set)") from None
    if not out:
        raise ConfigError(f"a {what} needs at least one layer: its layer set is empty")
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


@dataclass
class ReadOut:
    """One read of one pass.

    Attributes:
        read: what was asked.
        attention: float32 `[B, n_keys]`, the mean row over the read's heads on absolute key
            positions (each row sums to 1).
        rows: float32 `[B, len(read.heads)]` + `[n_keys]`, each head's row (returns "rows"), else None.
        span_mass: float32 `[B, len(read.heads), len(read.spans)]` (returns "span_mass"), else None.
    """

    read: Read
    attention: torch.Tensor
    rows: torch.Tensor | None = None
    span_mass: torch.Tensor | None = None


BiasRule = Callable[["ReadOut"], "torch.Tensor"]


def _heads_in_layers(heads: Iterable[tuple[int, int]] | None, layers: tuple[int, ...],
                     what: str) -> tuple[tuple[int, int], ...] | None:
    """A part's head pairs (None: every head of its layers), each in one of its layers."""
    pairs = None if heads is None else head_pairs(heads, f"a {what}'s head set")
    outside = [head_label(layer, h) for layer, h in pairs or () if layer not in layers]
    if outside:
        raise ConfigError(f"{what} heads {', '.join(outside)} are in layers the {what} does not apply to")
    return pairs


def _heads_of(pairs: tuple[tuple[int, int], ...] | None, layer: int) -> tuple[int, ...] | None:
    return None if pairs is None else tuple(h for l_, h in pairs if l_ == layer)


@dataclass(frozen=True, init=False)
class Scale:
    """A multiplicative change of the pre-softmax attention scores: `scores / temperature`,
    then, with `log_n`, times max(1, ln n / ln log_n), n being the number of keys the query
    sees (its position + 1): the logit growth Qwen's `use_logn_attn` applies past the
    training length `log_n`.

    Args:
        layers: the layers it applies to (a range or a set; not empty).
        heads: only these `(layer, head)` pairs of those layers (None: every head).
        temperature: a finite number > 0 (1: none).
        log_n: the training length past which log-n scaling grows the scores (None: none).
    """

    layers: tuple[int, ...]
    heads: tuple[tuple[int, int], ...] | None
    temperature: float
    log_n: int | None

    def __init__(self, layers: Iterable[int], heads: Iterable[tuple[int, int]] | None = None,
                 temperature: float = 1.0, log_n: int | None = None):
        object.__setattr__(self, "layers", _layers(layers, "scale"))
        object.__setattr__(self, "heads", _heads_in_layers(heads, self.layers, "scale"))
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not (math.isfinite(temperature) and temperature > 0):
            raise ConfigError(f"a scale's temperature must be a finite number > 0, got {temperature!r}")
        if log_n is not None and (isinstance(log_n, bool) or not isinstance(log_n, int) or log_n < 2):
            raise ConfigError(f"a scale's log_n is a training length (an integer >= 2) or None, got {log_n!r}")
        object.__setattr__(self, "temperature", float(temperature))
        object.__setattr__(self, "log_n", log_n)

    def heads_in(self, layer: int) -> tuple[int, ...] | None:
        """The query heads scaled in `layer` (None: all of them)."""
        return _heads_of(self.heads, layer)

    @property
    def uniform(self) -> bool:
        """Only a temperature on whole layers: a backend folds it into its softmax scale, as exact
        as the model's own 1/sqrt(d)."""
        return self.heads is None and self.log_n is None


def logn_factor(key_counts: torch.Tensor, train_length: int) -> torch.Tensor:
    """max(1, ln n / ln train_length) for each key count n, float32 (Qwen's log-n scaling)."""

    n = key_counts.float().clamp_min(1.0)
    return (n.log() / math.log(train_length)).clamp_min(1.0)


@dataclass(frozen=True, init=False)
class Mask:
    """Keys some layers' heads may not attend to: -inf on their scores where `values` is False.

    `values`: bool `[B, 1, 1, n_keys]` (or `[B, n_heads, 1, n_keys]`, `per_head`) on absolute key
    positions, True where a key may be attended to; every row must keep its own key. A plan's
    mask and its bias apply to the same layers and heads.
    """

    layers: tuple[int, ...]
    heads: tuple[tuple[int, int], ...] | None
    per_head: bool
    values: torch.Tensor | None = field(compare=False, repr=False)

    def __init__(self, layers: Iterable[int], heads: Iterable[tuple[int, int]] | None = None,
                 values: torch.Tensor | None = None, per_head: bool = False):
        object.__setattr__(self, "layers", _layers(layers, "mask"))
        object.__setattr__(self, "heads", _heads_in_layers(heads, self.layers, "mask"))
        if not isinstance(per_head, bool):
            raise ConfigError(f"a mask's per_head is True or False, not {per_head!r}")
        object.__setattr__(self, "per_head", per_head)
        object.__setattr__(self, "values", values)

    def heads_in(self, layer: int) -> tuple[int, ...] | None:
        """The query heads masked in `layer` (None: all of them)."""
        return _heads_of(self.heads, layer)

    def given(self, values: torch.Tensor) -> "Mask":
        return dataclasses.replace(self, values=values)


@dataclass(frozen=True, init=False)
class Keep:
    """The only keys the heads of some layers attend to: exactly a -inf on the scores of every
    key it does not name, in every head of `layers`.

    `positions`: long `[B, capacity]`, absolute key positions (the columns of left-padded rows, the
    token's own key at n_keys - 1); `valid`: bool `[B, capacity]`, False at slots that name no key
    (their positions are ignored). A row's valid positions are distinct and include its own key.
    The capacity is the caller's, fixed from step to step, so that a backend's shapes stay the
    same: the sdpa and static backends gather those keys and values only (a few percent of a long
    cache, under CUDA graphs on the static one), the bridge adds the -inf (the reference), flex
    adds it to its score_mod. A plan with a keep takes a given bias, not a rule's.

    A read in a kept layer covers every key: its rows are the softmax of the pass's scores there
    (scale, bias, mask) before the keep's -inf, while the heads' outputs attend to the kept keys
    only. A selection fed by such a read can reach the whole context, which a read of the kept
    keys alone never could; it costs the read heads' q.K over every key (their keys only, no
    values).
    """

    layers: tuple[int, ...]
    positions: torch.Tensor | None = field(compare=False, repr=False)
    valid: torch.Tensor | None = field(compare=False, repr=False)

    def __init__(self, layers: Iterable[int], positions: torch.Tensor | None = None,
                 valid: torch.Tensor | None = None):
        object.__setattr__(self, "layers", _layers(layers, "keep"))
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "valid", valid)

    @property
    def heads(self) -> None:
        """Every head of its layers (a keep is never limited to some heads)."""
        return None

    def given(self, positions: torch.Tensor, valid: torch.Tensor) -> "Keep":
        return dataclasses.replace(self, positions=positions, valid=valid)


@dataclass(frozen=True, init=False)
class Bias:
    """An additive bias on the pre-softmax attention scores.

    Args:
        layers: the layers it applies to (a range or a set; not empty).
        heads: only these `(layer, head)` pairs of those layers (None: every head).
        source: "tensor" (the caller's `values`) or "rule" (`rule(read)` on the pass's first
            read, run once that read's layers are done; every biased layer must come after them).
        per_head: the values hold one row per query head of the model (`[B, n_heads, 1, n_keys]`,
            row h applied to head h in every biased layer) instead of one row for all of them.
        values: float32 `[B, 1, 1, n_keys]` (or `[B, n_heads, 1, n_keys]` per head) on absolute
            key positions (the token's own key last); a batch of 1 applies to every row.
        rule: `ReadOut -> ` the same shape.
    """

    layers: tuple[int, ...]
    heads: tuple[tuple[int, int], ...] | None
    source: Literal["tensor", "rule"]
    per_head: bool
    values: torch.Tensor | None = field(compare=False, repr=False)
    rule: BiasRule | None = field(compare=False, repr=False)

    def __init__(self, layers: Iterable[int], heads: Iterable[tuple[int, int]] | None = None,
                 source: Literal["tensor", "rule"] = "tensor", values: torch.Tensor | None = None,
                 rule: BiasRule | None = None, per_head: bool = False):
        object.__setattr__(self, "layers", _layers(layers))
        pairs = _heads_in_layers(heads, self.layers, "bias")
        if source not in ("tensor", "rule"):
            raise ConfigError(f"a bias's source is 'tensor' or 'rule', not {source!r}")
        if not isinstance(per_head, bool):
            raise ConfigError(f"a bias's per_head is True or False, not {per_head!r}")
        for name, value in (("heads", pairs), ("source", source), ("per_head", per_head), ("values", values),
                            ("rule", rule)):
            object.__setattr__(self, name, value)

    def heads_in(self, layer: int) -> tuple[int, ...] | None:
        """The query heads biased in `layer` (None: all of them)."""
        return _heads_of(self.heads, layer)

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
    mask: Mask | None = None
    scale: Scale | None = None
    keep: Keep | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "reads", tuple(self.reads))
        for name, kind in (("bias", Bias), ("mask", Mask), ("scale", Scale), ("keep", Keep)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ConfigError(f"a plan's {name} is a plan.{kind.__name__}, got {type(value).__name__}")
        if self.stop_after is not None and self.write_cache:
            raise ConfigError("a pass that stops early cannot write the cache: the later layers' keys would be missing")
        if self.mask is not None and self.bias is not None:
            if (self.mask.layers, self.mask.heads) != (self.bias.layers, self.bias.heads):
                raise ConfigError("a plan's mask and bias apply to the same layers and heads (a backend adds them "
                                  "as one term)")
            if self.bias.source == "rule":
                raise ConfigError("a plan with a mask takes a given bias, not a rule's")
        if self.bias is not None and self.bias.source == "rule":
            if not self.reads:
                raise ConfigError("a bias built by a rule needs a read in the same pass")
            first = self.reads[0].max_layer
            early = [layer for layer in self.bias.layers if layer <= first]
            if early:
                raise ConfigError(f"a rule's bias can only apply after the read it is built from (layer {first}); "
                                  f"it names layer(s) {', '.join(map(str, early))}")
        if self.keep is not None:
            if self.bias is not None and self.bias.source == "rule":
                raise ConfigError("a plan with a keep takes a given bias, not a rule's")
        if self.stop_after is not None:
            deep = [r.max_layer for r in self.reads if r.max_layer > self.stop_after]
            if deep:
                raise ConfigError(f"the pass stops after layer {self.stop_after} but reads layer {max(deep)}")

    @property
    def kind(self) -> PassKind:
        """What `passes.current_pass().kind` calls it (a scale alone leaves a pass "plain")."""
        if self.stop_after is not None:
            return "partial"
        if self.bias is None:
            return "plain" if self.mask is None and self.keep is None else "biased"
        return "reuse" if self.bias.source == "rule" else "biased"

    @property
    def additive(self) -> Bias | None:
        """What a backend adds to the scores, as one structure: the bias, the mask's -inf, or
        both (`additive_values` makes its tensor)."""
        if self.mask is None:
            return self.bias
        per_head = self.mask.per_head or (self.bias is not None and self.bias.per_head)
        return Bias(self.mask.layers, self.mask.heads, per_head=per_head)

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

    def with_mask(self, values: torch.Tensor) -> "PassPlan":
        """The same plan carrying this step's mask (bool, True where a key may be attended to)."""
        if self.mask is None:
            raise ConfigError("this plan has no mask to give values to")
        return dataclasses.replace(self, mask=self.mask.given(values))

    def with_keep(self, positions: torch.Tensor, valid: torch.Tensor) -> "PassPlan":
        """The same plan carrying this step's kept keys (`Keep`)."""
        if self.keep is None:
            raise ConfigError("this plan has no keep to give positions to")
        return dataclasses.replace(self, keep=self.keep.given(positions, valid))

    def check(self, n_layers: int, n_heads: int) -> "PassPlan":
        """This plan if it fits a model of `n_layers` x `n_heads`; else a ConfigError naming what does not."""
        if self.stop_after is not None and not 0 <= self.stop_after < n_layers:
            raise ConfigError(f"stop_after={self.stop_after} is outside the model's {n_layers} layers")
        pairs = [p for read in self.reads for p in read.heads]
        parts: tuple[tuple[str, Bias | Mask | Scale | Keep | None], ...] = (
            ("bias", self.bias), ("mask", self.mask), ("scale", self.scale), ("keep", self.keep))
        for what, part in parts:
            if part is None:
                continue
            wide = [layer for layer in part.layers if not 0 <= layer < n_layers]
            if wide:
                raise ConfigError(f"{what} layer {wide[0]} is outside the model's {n_layers} layers")
            if self.stop_after is not None and part.layers[-1] > self.stop_after:
                raise ConfigError(f"the pass stops after layer {self.stop_after} but its {what} reaches layer "
                                  f"{part.layers[-1]}")
            pairs += list(part.heads or ())
        for layer, head in pairs:
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise ConfigError(f"head {head_label(layer, head)} is outside the model "
                                  f"({n_layers} layers x {n_heads} heads)")
        return self


def plain(read: Read | None = None) -> PassPlan:
    """The whole model, cache written, no bias (optionally reading)."""
    return PassPlan(reads=() if read is None else (read,))


def check_bias_values(values: torch.Tensor, batch: int, n_keys: int, n_heads: int | None = None,
                      what: str = "bias") -> torch.Tensor:
    """A given or ruled bias (or mask) of the right shape: `[B or 1, 1, 1, n_keys]`, or with
    `n_heads` (a per-head part) `[B or 1, n_heads, 1, n_keys]`; a bias as float32. Its values are
    checked by `bias_fault`, which never waits for the device."""
    import torch

    if not isinstance(values, torch.Tensor):
        raise ConfigError(f"a {what} is a tensor, got {type(values).__name__}")
    rows = 1 if n_heads is None else n_heads
    if values.ndim != 4 or values.shape[1:3] != (rows, 1) or values.shape[0] not in (1, batch) \
            or values.shape[-1] != n_keys:
        shape = "batch, 1, 1, n_keys" if n_heads is None else "batch, n_heads, 1, n_keys"
        raise ConfigError(f"a {what} must be [{shape}] = [{batch}, {rows}, 1, {n_keys}], got {list(values.shape)}")
    if what == "mask":
        if values.dtype != torch.bool:
            raise ConfigError(f"a mask is a bool tensor (True: the key may be attended to), got {values.dtype}")
        return values
    return values.float()


def additive_values(plan: PassPlan, batch: int, n_keys: int, n_heads: int) -> torch.Tensor | None:
    """The tensor of a plan's given bias plus its mask's -inf, float32 (None: neither; a rule's
    bias is built during the pass instead)."""
    import torch

    bias, mask = plan.bias, plan.mask
    out = None
    if bias is not None and bias.source == "tensor":
        if bias.values is None:
            raise ConfigError("the plan's bias has no values: give them with plan.with_bias(tensor)")
        out = check_bias_values(bias.values, batch, n_keys, n_heads if bias.per_head else None)
    if mask is not None:
        if mask.values is None:
            raise ConfigError("the plan's mask has no values: give them with plan.with_mask(tensor)")
        keep = check_bias_values(mask.values, batch, n_keys, n_heads if mask.per_head else None, "mask")
        masked = torch.zeros(keep.shape, dtype=torch.float32, device=keep.device).masked_fill_(~keep, -math.inf)
        out = masked if out is None else out.to(masked.device) + masked
    return out


# The largest finite bias a plan may add. Attention scores are tens at most, so 1e4 already
# decides any softmax; far beyond it, score + bias overflows (3e38 is finite, twice it is not)
# and softmax is undefined, which backends then answer differently.
MAX_BIAS = 1e4

# What `bias_fault` flags, one bit each, and how `bias_fault_message` words it.
_FAULTS = (
    "holds NaN or +inf",
    f"holds a finite value beyond +-{MAX_BIAS:g}",
    "leaves some row no finite key (-inf on every key, the token's own included)",
    "keeps a key position outside the step's keys (plan.Keep)",
    "keeps a key position twice in one row (plan.Keep)",
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


def check_keep_values(keep: Keep, batch: int, n_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A keep's positions (long) and valid slots (bool), both `[batch, capacity]` on one device;
    a ConfigError for a missing or misshapen one. Their values are checked by `keep_fault`."""
    import torch

    positions, valid = keep.positions, keep.valid
    if positions is None or valid is None:
        raise ConfigError("the plan's keep has no positions: give them with plan.with_keep(positions, valid)")
    if not (isinstance(positions, torch.Tensor) and isinstance(valid, torch.Tensor)):
        raise ConfigError("a keep's positions and valid slots are tensors")
    if positions.ndim != 2 or positions.shape[0] != batch or valid.shape != positions.shape:
        raise ConfigError(f"a keep's positions and valid slots are [batch, capacity] with batch {batch}, got "
                          f"{list(positions.shape)} and {list(valid.shape)}")
    if positions.dtype != torch.long or valid.dtype != torch.bool:
        raise ConfigError(f"a keep's positions are long and its valid slots bool, got {positions.dtype} and "
                          f"{valid.dtype}")
    return positions, valid.to(positions.device)


def keep_fault(positions: torch.Tensor, valid: torch.Tensor, n_keys: int) -> torch.Tensor:
    """`bias_fault`'s bits for a keep: a row with no valid slot, a position outside 0..n_keys-1,
    a position twice in a row. Device tensors only: it never waits for the device."""
    import torch

    empty = (~valid.any(dim=-1)).any()
    outside = (valid & ((positions < 0) | (positions >= n_keys))).any()
    unique = -1 - torch.arange(positions.shape[-1], device=positions.device)  # distinct and negative
    ordered = torch.where(valid, positions, unique).sort(dim=-1).values
    twice = ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any()
    return (empty.int() << 2) | (outside.int() << 3) | (twice.int() << 4)


def keep_mask(positions: torch.Tensor, valid: torch.Tensor, n_keys: int) -> torch.Tensor:
    """What a keep means: bool `[B, n_keys]`, True at its valid positions (a position outside the
    keys names none)."""
    import torch

    inside = valid & (positions >= 0) & (positions < n_keys)
    slots = torch.where(inside, positions, n_keys)  # the ones that name nothing land in a spare column
    out = torch.zeros(positions.shape[0], n_keys + 1, dtype=torch.bool, device=positions.device)
    return out.scatter_(1, slots, inside)[:, :n_keys]
