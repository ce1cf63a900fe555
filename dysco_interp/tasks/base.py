"""What every task generator shares: seeds, checks, stored spans and fitting to a token length.

Every generator builds a chat, encodes it with `dysco_interp.chat.encode_chat` and records
character spans of the rendered text plus the token spans they cover, so analyses can sum
attention over exactly the tokens the model saw. The prompt grows by whole units (an edge
line, a document, a chat turn) until its token count is within a tolerance of the target.
"""

from __future__ import annotations

import json
import random
import re
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from importlib import resources
from typing import Any, ClassVar, Self, TypedDict, TypeVar

from dysco_interp.chat import EncodedPrompt, Span
from dysco_interp.checks import is_int, typed
from dysco_interp.errors import ConfigError, DataError

T = TypeVar("T")

DEFAULT_TOLERANCE = 0.05


def package_words(package: str) -> dict:
    """The word lists a task package ships as data, in its `words.json`."""
    return json.loads(resources.files(package).joinpath("words.json").read_text(encoding="utf-8"))


def instance_rng(task: str, seed: int, *parts: object) -> random.Random:
    """A generator seeded by the task, the user's seed and the instance's coordinates.

    String seeds hash with SHA-512 in `random.Random`, so they are stable across runs
    and platforms (unlike `hash()`).
    """
    return random.Random(":".join(str(p) for p in (task, seed, *parts)))


class Provenance(TypedDict):
    """A generated instance's id and the coordinates that fix it, stored in its fields of the same names."""

    id: str
    seed: int
    index: int
    target_tokens: int | None


def provenance(task: str, seed: int, index: int, target_tokens: int | None, count: int | None, unit: str) -> Provenance:
    """What an instance records of its origin; its id reads 'task-s0-3-4096t' for a target length and
    'task-s0-3-12x' (`unit` letter after `count`) for a fixed size."""
    size = f"{target_tokens}t" if target_tokens else f"{count}{unit}"
    return Provenance(id=f"{task}-s{seed}-{index}-{size}", seed=seed, index=index, target_tokens=target_tokens)


_ID = re.compile(r"(?P<task>[a-z_]+)-s(?P<seed>\d+)-(?P<index>\d+)-\d+[a-z]")


@dataclass(frozen=True)
class Origin:
    """What fixes a generated instance: its task, data seed and index."""

    task: str
    seed: int
    index: int


def instance_origin(instance_id: str) -> Origin | None:
    """The origin read back from an id `provenance` made (a result record keeps the id alone);
    None for any other id."""
    m = _ID.fullmatch(str(instance_id))
    return None if m is None else Origin(m["task"], int(m["seed"]), int(m["index"]))


def check_positive(name: str, value: object) -> int:
    """`value` when it is an int of at least 1 (not a bool); ConfigError naming `name` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_tolerance(tolerance: float) -> float:
    if not 0 < tolerance < 1:
        raise ConfigError(f"tolerance must be a fraction in (0, 1), got {tolerance!r}")
    return tolerance


def tokenizer_name(tokenizer) -> str | None:
    """The name a tokenizer was loaded under, for provenance in stored instances."""
    name = getattr(tokenizer, "name_or_path", None) or getattr(tokenizer, "init_kwargs", {}).get("name_or_path")
    return str(name) if name else None


def check_same_tokenizer(instance, n_ids: int) -> None:
    """ConfigError unless a tokenizer gives the instance's prompt the length recorded with it."""
    if n_ids != instance.n_tokens:
        raise ConfigError(
            f"instance {instance.id!r} was made for another tokenizer ({instance.tokenizer}): its prompt "
            f"has {instance.n_tokens} tokens, this tokenizer gives {n_ids}; regenerate the data for this model"
        )


class PromptFields(TypedDict):
    """What every instance stores about its rendered prompt, in its fields of the same names."""

    prompt_text: str
    n_tokens: int
    n_generation_prompt: int
    tokenizer: str | None
    enable_thinking: bool | None


def prompt_fields(encoded: EncodedPrompt, tokenizer, enable_thinking: bool | None) -> PromptFields:
    """The rendered text, its token counts and the tokenizer's name, for an instance's constructor."""
    return PromptFields(
        prompt_text=encoded.text,
        n_tokens=len(encoded),
        n_generation_prompt=encoded.n_generation_prompt,
        tokenizer=tokenizer_name(tokenizer),
        enable_thinking=enable_thinking,
    )


def token_spans(encoded: EncodedPrompt, char_spans: Iterable[Span]) -> list[Span]:
    """Token span covering each character span of an encoded prompt."""
    return [encoded.token_span(a, b) for a, b in char_spans]


def as_spans(values) -> list[Span]:
    """JSON lists back to span tuples."""
    return [tuple(v) for v in values]


_WORDS: dict[Any, tuple[str, str]] = {  # a JSON type: (one, many)
    str: ("a string", "strings"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    bool: ("true or false", "true or false"),
    dict: ("an object", "objects"),
    list: ("a list", "lists"),
    type(None): ("null", "null"),
    Span: ("a [start, end] pair of integers", "[start, end] pairs of integers"),
}


def _words(tp: Any, many: bool = False) -> str:
    if tp in _WORDS:
        return _WORDS[tp][many]
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return " or ".join(_words(a, many) for a in typing.get_args(tp))
    origin = typing.get_origin(tp)
    if origin in _WORDS:
        args = typing.get_args(tp)
        if origin is list and args:
            return "lists of " + _words(args[0], True) if many else "a list of " + _words(args[0], True)
        return _WORDS[origin][many]
    return "values" if many else "a value"


def type_problem(name: str, value: Any, tp: Any) -> str | None:
    """Why the JSON `value` of field `name` is not of the annotated type `tp` (a list names its
    first bad item), or None. Spans come as [start, end] lists; a bool is never a number."""
    if tp is Any:
        return None
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        alternatives = typing.get_args(tp)
        if any(type_problem(name, value, a) is None for a in alternatives):
            return None
        if value is not None and type(None) in alternatives:  # an optional list: name its bad item
            rest = [a for a in alternatives if a is not type(None)]
            if len(rest) == 1 and typing.get_origin(rest[0]) is list and isinstance(value, list):
                return type_problem(name, value, rest[0])
        return f"'{name}' must be {_words(tp)}, got {typed(value)}"
    origin, args = typing.get_origin(tp) or tp, typing.get_args(tp)
    if origin is tuple:
        ok = isinstance(value, (list, tuple)) and len(value) == len(args) and all(
            type_problem(name, v, a) is None for v, a in zip(value, args))
    elif origin is list:
        if isinstance(value, list) and args:
            return next((p for i, v in enumerate(value) if (p := type_problem(f"{name}[{i}]", v, args[0]))), None)
        ok = isinstance(value, list)
    elif origin is int:
        ok = is_int(value)
    elif origin is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif origin is type(None):
        ok = value is None
    else:
        ok = isinstance(value, origin)
    return None if ok else f"'{name}' must be {_words(tp)}, got {typed(value)}"


_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    if cls not in _FIELD_TYPES:
        _FIELD_TYPES[cls] = typing.get_type_hints(cls)
    return _FIELD_TYPES[cls]


class SpanRecord:
    """`to_dict` / `from_dict` for a task's instance dataclass, one JSON object per instance.

    Spans are tuples in memory and lists in JSON; a subclass names its fields holding one
    span (`SPAN_FIELDS`) and those holding a list of spans (`SPAN_LIST_FIELDS`). `from_dict`
    refuses a record whose fields are not of their annotated types or whose spans leave
    what they index (`span_bounds`), and what `problem` finds: a DataError, before any model
    sees the instance.
    """

    SPAN_FIELDS: ClassVar[tuple[str, ...]] = ()
    SPAN_LIST_FIELDS: ClassVar[tuple[str, ...]] = ()
    # Declared (not set) so type checkers see a dataclass: every subclass is one.
    __dataclass_fields__: ClassVar[dict[str, Any]]
    # Fields every task's instance has (declared here, defined by each dataclass).
    id: str
    n_tokens: int
    prompt_text: str

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in self.SPAN_LIST_FIELDS:
            d[k] = [list(s) for s in d[k]]
        for k in self.SPAN_FIELDS:
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Self:
        d = dict(d)
        hints = _field_types(cls)
        for f in fields(cls):
            problem = type_problem(f.name, d[f.name], hints[f.name]) if f.name in d else None
            if problem:
                raise DataError(problem)
        for k in cls.SPAN_LIST_FIELDS:
            d[k] = as_spans(d[k])
        for k in cls.SPAN_FIELDS:
            d[k] = tuple(d[k])
        instance = cls(**d)
        problem = instance.span_problem() or instance.problem()
        if problem:
            raise DataError(problem)
        return instance

    def span_bounds(self) -> dict[str, tuple[int, str]]:
        """Per span field, the length it indexes and how to name it: token spans index the
        prompt's ids, character spans its rendered text (a task whose spans index more says so)."""
        n_tokens, n_chars = self.n_tokens, len(self.prompt_text)
        tokens, chars = (n_tokens, f"the prompt's {n_tokens} tokens"), (n_chars, f"the prompt's {n_chars} characters")
        return {k: tokens if "token" in k else chars for k in (*self.SPAN_FIELDS, *self.SPAN_LIST_FIELDS)}

    def span_problem(self) -> str | None:
        """The first span that is reversed or leaves what it indexes, or None."""
        for name, (limit, what) in self.span_bounds().items():
            value = getattr(self, name)
            spans = [(f"{name}[{i}]", s) for i, s in enumerate(value)] if name in self.SPAN_LIST_FIELDS \
                else [(name, value)]
            for label, (start, end) in spans:
                if not 0 <= start <= end <= limit:
                    return f"{label} ({start}, {end}) is outside {what}" if start <= end \
                        else f"{label} ({start}, {end}) ends before it starts"
        return None

    def problem(self) -> str | None:
        """What else makes the instance unusable (a task's own rules), or None."""
        return None


@dataclass(frozen=True)
class LengthSearch:
    """A unit count to find: the prompt with it has `target` tokens, within tolerance × target.

    Each unit (an edge line, a document, a chat turn) adds about `tokens_per_unit` tokens to
    the `overhead` of a prompt with none; the search starts from the count that estimate gives
    and stays in [min_count, max_count]. A target below what min_count gives is a ConfigError
    worded by `too_short(got)`, one above what max_count gives by `too_long(got)`.
    """

    target: int
    tolerance: float
    overhead: float
    tokens_per_unit: float
    min_count: int
    max_count: int
    too_short: Callable[[int], str]
    too_long: Callable[[int], str] | None = None  # None: a generic message

    @property
    def first_guess(self) -> int:
        return round((self.target - self.overhead) / self.tokens_per_unit)

    def too_long_message(self, got: int) -> str:
        if self.too_long is not None:
            return self.too_long(got)
        return f"target length {self.target} tokens is beyond what this generator supports"

    def missed(self, got: int) -> ConfigError:
        return ConfigError(
            f"could not reach {self.target} tokens within {self.tolerance:.0%} (closest: {got} tokens); "
            "use a larger tolerance or another target length"
        )


def fit_count(
    build: Callable[[int], T],
    n_tokens: Callable[[T], int],
    search: LengthSearch,
    *,
    max_builds: int = 8,
    strict: bool = True,
) -> T:
    """The built object whose token count is closest to `search.target`, over a unit count.

    `build(count)` must be deterministic. The search starts from an estimate and moves by
    secant steps, so a long prompt is tokenized a handful of times, not once per unit.
    A target below what min_count gives, or above what max_count gives, is a ConfigError;
    so is missing the tolerance, unless `strict` is False (the caller refines further).
    """
    target, tolerance = search.target, search.tolerance
    min_count, max_count = search.min_count, search.max_count
    if min_count > max_count:
        raise ConfigError(search.too_long_message(min_count))
    cache: dict[int, tuple[T, int]] = {}

    def measure(count: int) -> int:
        if count not in cache:
            obj = build(count)
            cache[count] = (obj, n_tokens(obj))
        return cache[count][1]

    count = min(max(search.first_guess, min_count), max_count)
    slope = max(search.tokens_per_unit, 1e-6)
    # Within half a unit, or well inside the tolerance: each further build costs a full encode.
    close_enough = max(slope / 2, tolerance * target / 5)
    for _ in range(max_builds):
        got = measure(count)
        error = target - got
        if abs(error) <= close_enough:
            break
        nxt = min(max(count + (round(error / slope) or (1 if error > 0 else -1)), min_count), max_count)
        if nxt in cache:  # at a bound, or about to oscillate between two counts
            break
        secant = (measure(nxt) - got) / (nxt - count)
        if secant > 0:
            slope = secant
        count = nxt
    best_count = min(cache, key=lambda c: (abs(cache[c][1] - target), c))
    best, got = cache[best_count]
    if abs(got - target) > tolerance * target:
        if got > target and best_count == min_count:
            raise ConfigError(search.too_short(got))
        if got < target and best_count == max_count:
            raise ConfigError(search.too_long_message(got))
        if not strict:
            return best
        raise search.missed(got)
    return best


def fit_count_and_variant(
    n_tokens: Callable[[int, int], int], search: LengthSearch, *, n_variants: int = 8
) -> tuple[int, int]:
    """(count, variant) whose prompt is closest to `search.target`, for tasks with coarse units.

    `n_tokens(count, variant)` is the prompt length with `count` units, the last one redrawn
    as `variant` (0: not redrawn). A unit (a document, a chat turn) is large next to the
    tolerance, so after `fit_count` over the count, variants 1..n_variants of the last unit
    are tried at count, count - 1 and count + 1 (above min_count, so a last unit exists to
    redraw) until one is well inside the tolerance. ConfigError when none is within it.
    """
    target = search.target

    def measure(count: int, variant: int = 0) -> tuple[tuple[int, int], int]:
        return (count, variant), n_tokens(count, variant)

    best = fit_count(measure, lambda trial: trial[1], search, strict=False)
    good = search.tolerance * target / 2
    count = best[0][0]
    trials = ((c, v) for c in (count, count - 1, count + 1) if c > search.min_count for v in range(1, n_variants + 1))
    for c, v in trials:
        if abs(best[1] - target) <= good:
            break
        best = min(best, measure(c, v), key=lambda t: abs(t[1] - target))
    if abs(best[1] - target) > search.tolerance * target:
        raise search.missed(best[1])
    return best[0]
