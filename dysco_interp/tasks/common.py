"""Shared plumbing for task generators: seeds, spans in rendered chats, length fitting, JSONL.

Every generator builds a chat, encodes it with `dysco_interp.chat.encode_chat` and records
character spans of the rendered text plus the token spans they cover, so analyses can sum
attention over exactly the tokens the model saw.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from dysco_interp.atomic import atomic_open
from dysco_interp.errors import ConfigError, DataError

Span = tuple[int, int]
T = TypeVar("T")

DEFAULT_TOLERANCE = 0.05


def instance_rng(task: str, seed: int, *parts: object) -> random.Random:
    """A generator seeded by the task, the user's seed and the instance's coordinates.

    String seeds hash with SHA-512 in `random.Random`, so they are stable across runs
    and platforms (unlike `hash()`).
    """
    return random.Random(":".join(str(p) for p in (task, seed, *parts)))


def check_positive(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_tolerance(tolerance: float) -> float:
    if not 0 < tolerance < 1:
        raise ConfigError(f"tolerance must be a fraction in (0, 1), got {tolerance!r}")
    return tolerance


def locate_contents(text: str, contents: Sequence[str]) -> list[Span]:
    """Character span of each message content in the rendered chat, in order.

    Contents are searched left to right from the end of the previous one, so repeated
    identical messages (MRCR) map to their own occurrences.
    """
    spans, pos = [], 0
    for i, content in enumerate(contents):
        start = text.find(content, pos)
        if start < 0:
            raise ValueError(
                f"message {i} does not appear verbatim in the rendered chat; the chat template "
                "rewrites message contents, so spans cannot be recorded"
            )
        spans.append((start, start + len(content)))
        pos = start + len(content)
    return spans


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


def token_spans(encoded, char_spans: Iterable[Span]) -> list[Span]:
    """Token span covering each character span of an `EncodedPrompt`."""
    return [tuple(encoded.token_span(a, b)) for a, b in char_spans]


def fit_count(
    build: Callable[[int], T],
    n_tokens: Callable[[T], int],
    target: int,
    tolerance: float,
    first_guess: int,
    tokens_per_unit: float,
    min_count: int,
    max_count: int,
    too_short: Callable[[int], str],
    too_long: Callable[[int], str],
    max_builds: int = 8,
    strict: bool = True,
) -> T:
    """The built object whose token count is closest to `target`, searching over a unit count.

    `build(count)` must be deterministic. The search starts from an estimate and moves by
    secant steps, so a long prompt is tokenized a handful of times, not once per unit.
    A target below what min_count gives, or above what max_count gives, is a ConfigError;
    so is missing the tolerance, unless `strict` is False (the caller refines further).
    """
    if min_count > max_count:
        raise ConfigError(too_long(min_count))
    cache: dict[int, tuple[T, int]] = {}

    def measure(count: int) -> int:
        if count not in cache:
            obj = build(count)
            cache[count] = (obj, n_tokens(obj))
        return cache[count][1]

    count = min(max(first_guess, min_count), max_count)
    slope = max(tokens_per_unit, 1e-6)
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
            raise ConfigError(too_short(got))
        if got < target and best_count == max_count:
            raise ConfigError(too_long(got))
        if not strict:
            return best
        raise ConfigError(
            f"could not reach {target} tokens within {tolerance:.0%} (closest: {got} tokens); "
            "use a larger tolerance or another target length"
        )
    return best


def refine_with_variants(
    measure: Callable[[int, int], tuple[object, int]],
    best: tuple[object, int],
    count: int,
    target: int,
    tolerance: float,
    n_variants: int = 8,
    min_count: int = 1,
) -> tuple[object, int]:
    """Closer to `target` by redrawing the last unit (variant 1..n) at count - 1, count, count + 1.

    For tasks whose unit (a document, a chat turn) is large next to the tolerance.
    `measure(count, variant)` returns (key, n_tokens); `best` is the coarse search's result.
    Raises ConfigError when no trial is within the tolerance.
    """
    good = tolerance * target / 2
    trials = ((c, v) for c in (count, count - 1, count + 1) if c >= min_count for v in range(1, n_variants + 1))
    for c, v in trials:
        if abs(best[1] - target) <= good:
            break
        best = min(best, measure(c, v), key=lambda t: abs(t[1] - target))
    if abs(best[1] - target) > tolerance * target:
        raise ConfigError(
            f"could not reach {target} tokens within {tolerance:.0%} (closest: {best[1]} tokens); "
            "use a larger tolerance or another target length"
        )
    return best


_LENGTH_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_length(text: str | int) -> int:
    """'8k' -> 8192, '0.5k' -> 512, '1500' -> 1500 (k means 1024, as in '32K context')."""
    if isinstance(text, int) and not isinstance(text, bool):
        return check_positive("length", text)
    m = _LENGTH_RE.match(str(text))
    if not m:
        raise ConfigError(f"invalid length {text!r}: use a token count such as 1500, 2k or 32K")
    scale = {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
    value = float(m.group(1)) * scale
    if value < 1 or not math.isfinite(value):
        raise ConfigError(f"invalid length {text!r}: must be at least 1 token")
    return int(round(value))


def parse_lengths(text: str) -> list[int]:
    """A comma-separated list of lengths: '1k,2k,4k' -> [1024, 2048, 4096]."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ConfigError("no lengths given: use e.g. --lengths 1k,2k,4k,8k")
    return [parse_length(p) for p in parts]


def write_jsonl(path: str | Path, records: Iterable) -> Path:
    """One JSON object per line; objects with `to_dict` are converted.

    Atomic: the lines go to a temporary file beside `path`, which then replaces it, so a
    killed run or a record that cannot be serialised never leaves a truncated data file.
    """
    path = Path(path)
    with atomic_open(path) as f:
        for rec in records:
            obj = rec.to_dict() if hasattr(rec, "to_dict") else rec
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return path


def open_input(path: str | Path, missing: str, folder: str, unreadable: str):
    """`path` opened for binary reading; a DataError with the given words (each formatted with
    `path`, and `unreadable` also with `why`) when it is missing, a folder or unreadable."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise DataError(missing.format(path=path)) from None
    except IsADirectoryError:
        raise DataError(folder.format(path=path)) from None
    except OSError as e:
        raise DataError(unreadable.format(path=path, why=e.strerror or e)) from None


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; a DataError names the file and the line.

    Lines are decoded one at a time, so a binary file or a truncated last record is
    reported where it is, not as a UnicodeDecodeError or JSONDecodeError from deep inside.
    """
    path = Path(path)
    f = open_input(path, "data file not found: {path}", "{path} is a folder, not a JSONL data file",
                   "cannot read data file {path}: {why}")
    with f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}, line {number}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                    "is it a JSONL data file?"
                ) from None
            if not line.strip():
                continue
            text = line.rstrip("\r\n")
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                # an error at the very end of the line, or a string never closed, means the record
                # stops early: a cut-off write, not a typo
                cut = e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string")
                where = f"{e.msg}{'' if e.msg.endswith(' at') else ' at'} column {e.colno}"
                why = f"{where}; the record stops early, the file looks truncated" if cut else where
                raise DataError(f"{path}, line {number}: not valid JSON ({why})") from None
            except RecursionError:
                raise DataError(f"{path}, line {number}: JSON nested too deeply to be a data record") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}, line {number}: expected a JSON object, got {type(obj).__name__}")
            yield number, obj


def read_jsonl(path: str | Path, cls=None) -> list:
    """Records of a JSONL file, as `cls.from_dict(...)` when a class is given."""
    return [cls.from_dict(obj) if cls is not None else obj for _, obj in iter_jsonl(path)]


def as_spans(values) -> list[Span]:
    """JSON lists back to span tuples."""
    return [tuple(v) for v in values]
