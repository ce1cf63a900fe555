"""HeadSet: an ordered set of attention heads with scores and provenance, and its files.

A head is `(layer, query_head)`, 0-indexed, in TransformerLens conventions: under
GQA the index is the *query* head (head h reads KV head h // group), labels are
`L{l}H{h}`. Order is ranking order (best first) when the set comes from a detector.

Files:
- our own JSON (`format: dysco-interp/heads`), with geometry and provenance, checked
  against the loaded model;
- importers for the public formats: QRHead's JSON `[["L-H", score], ...]` and its
  string/YAML form `"L-H,L-H"`, DySCO's YAML list of (layer, head) pairs, and
  Retrieval_Head's JSON `{"L-H": [score per example]}`.

Nothing here unpickles or evals: JSON goes through `json`, YAML through a safe loader
that also refuses duplicate keys, and every value is type-checked.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import os
import random
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from dysco_interp import __version__
from dysco_interp.atomic import atomic_open
from dysco_interp.checks import brief
from dysco_interp.errors import ConfigError, DyscoError

FORMAT = "dysco-interp/heads"
FORMAT_VERSION = 1

# Names accepted by `load_heads(fmt=...)`.
FMT_OURS = "dysco-interp"
FMT_QRHEAD_JSON = "qrhead-json"
FMT_QRHEAD_YAML = "qrhead-yaml"
FMT_DYSCO_YAML = "dysco-yaml"
FMT_RETRIEVAL_HEAD = "retrieval-head-json"
FORMATS = (FMT_OURS, FMT_QRHEAD_JSON, FMT_QRHEAD_YAML, FMT_DYSCO_YAML, FMT_RETRIEVAL_HEAD)
_FMT_ALIASES = {"qrhead-string": FMT_QRHEAD_YAML, "ours": FMT_OURS, "json": FMT_OURS}

Head = tuple[int, int]


class HeadSetError(DyscoError, ValueError):
    """A head set is invalid: bad index, duplicate head, scores of the wrong length."""


class HeadFileError(HeadSetError):
    """A head file (or an object given in its place) cannot be read as a head set."""


class HeadModelMismatchError(HeadSetError):
    """A head set was made for a different model (name or geometry) than the loaded one."""


# --------------------------------------------------------------------------- geometry


@dataclass(frozen=True)
class Geometry:
    """The attention geometry a head set refers to; `name` is the model id, if known."""

    name: str | None
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None

    def describe(self) -> str:
        kv = f", {self.n_kv_heads} KV heads" if self.n_kv_heads is not None else ""
        return f"{self.n_layers} layers x {self.n_heads} heads{kv}"


def geometry_of(obj: Any) -> Geometry:
    """A Geometry from a ModelSpec-like object, a LoadedModel, a HeadSet or a tuple.

    Tuples are `(n_layers, n_heads)` or `(n_layers, n_heads, n_kv_heads)`.
    """
    if isinstance(obj, Geometry):
        return obj
    if isinstance(obj, HeadSet):
        if obj.geometry is None:
            raise ConfigError("this head set records no geometry (n_layers, n_heads); pass one")
        return obj.geometry
    if hasattr(obj, "spec") and not hasattr(obj, "n_layers"):
        obj = obj.spec  # a LoadedModel
    if isinstance(obj, (tuple, list)):
        if len(obj) not in (2, 3):
            raise ConfigError(f"geometry tuple must be (n_layers, n_heads[, n_kv_heads]), got {brief(obj)}")
        vals = [_positive_int(v, "geometry value") for v in obj]
        return Geometry(None, vals[0], vals[1], vals[2] if len(vals) == 3 else None)
    if hasattr(obj, "n_layers") and hasattr(obj, "n_heads"):
        kv = getattr(obj, "n_kv_heads", None)
        return Geometry(
            getattr(obj, "name", None),
            _positive_int(obj.n_layers, "n_layers"),
            _positive_int(obj.n_heads, "n_heads"),
            None if kv is None else _positive_int(kv, "n_kv_heads"),
        )
    raise ConfigError(
        f"cannot read a model geometry from {type(obj).__name__}: pass a ModelSpec, a LoadedModel "
        "or (n_layers, n_heads[, n_kv_heads])"
    )


def normalize_model_id(name: str) -> str:
    """Compare model ids loosely: 'Qwen/Qwen2.5-Coder-0.5B-Instruct' ~ 'qwen2.5-coder-0.5b'.

    Registry aliases, hub names and local folders name the same model differently;
    the last path component, lower-cased, without an '-instruct' suffix, is what we compare.
    """
    base = re.split(r"[\\/]", name.strip().rstrip("/\\"))[-1].lower()
    return base.removesuffix("-instruct")


# --------------------------------------------------------------------------- labels


def head_label(layer: int, head: int) -> str:
    """TransformerLens label of a head: 'L{layer}H{head}'."""
    return f"L{layer}H{head}"


# One pattern per accepted spelling; signs are allowed here so that a negative index
# gets its own message instead of "bad label".
_LABEL_PATTERNS = (
    re.compile(r"^L(-?\d+)H(-?\d+)$"),  # TransformerLens: L16H3
    re.compile(r"^(-?\d+)-(-?\d+)$"),  # QRHead / Retrieval_Head: 16-3
    re.compile(r"^\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)$"),  # DySCO tuple as text: (16, 3)
)


def parse_head_label(text: str) -> Head:
    """Parse 'L16H3', '16-3' or '(16, 3)' into (16, 3); anything else is a HeadSetError."""
    if not isinstance(text, str):
        raise HeadSetError(f"head label must be a string, got {type(text).__name__} {brief(text)}")
    for pattern in _LABEL_PATTERNS:
        m = pattern.match(text.strip())
        if m:
            layer, head = int(m.group(1)), int(m.group(2))
            if layer < 0 or head < 0:
                raise HeadSetError(f"head label {brief(text)} has a negative index")
            return layer, head
    raise HeadSetError(f"bad head label {brief(text)}: expected 'layer-head' ('16-3'), 'L16H3' or '(16, 3)'")


# --------------------------------------------------------------------------- checks


def _is_intlike(x: Any) -> bool:
    # bool is an int subclass; True as a layer index is always a mistake.
    if isinstance(x, (bool, str, float)):
        return False
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def _nonneg_int(x: Any, what: str) -> int:
    if not _is_intlike(x):
        raise HeadSetError(f"{what} must be an integer, got {type(x).__name__} {brief(x)}")
    v = operator.index(x)
    if v < 0:
        raise HeadSetError(f"{what} must be >= 0, got {v}")
    return v


def _positive_int(x: Any, what: str) -> int:
    v = _nonneg_int(x, what)
    if v == 0:
        raise HeadSetError(f"{what} must be >= 1, got 0")
    return v


def _score(x: Any, what: str) -> float:
    if isinstance(x, (bool, str)) or x is None:
        raise HeadSetError(f"{what} must be a number, got {type(x).__name__} {brief(x)}")
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise HeadSetError(f"{what} must be a number, got {type(x).__name__} {brief(x)}") from None
    if not math.isfinite(v):
        raise HeadSetError(f"{what} must be finite, got {v}")
    return v


def _opt_str(x: Any, what: str) -> str | None:
    if x is not None and not isinstance(x, str):
        raise HeadSetError(f"{what} must be a string or null, got {type(x).__name__} {brief(x)}")
    return x


def _head_pair(x: Any, what: str) -> Head:
    if isinstance(x, str):
        return parse_head_label(x)
    # Sets and mappings have no order; anything else must be a length-2 sequence.
    if isinstance(x, (Mapping, set, frozenset, bytes)) or not hasattr(x, "__len__"):
        raise HeadSetError(f"{what} must be a (layer, head) pair, got {type(x).__name__} {brief(x)}")
    items = list(x)
    if len(items) != 2:
        raise HeadSetError(f"{what} must have 2 elements (layer, head), got {len(items)}: {brief(x)}")
    return _nonneg_int(items[0], f"{what} layer"), _nonneg_int(items[1], f"{what} head")


# --------------------------------------------------------------------------- HeadSet


@dataclass(frozen=True)
class HeadSet:
    """An ordered set of (layer, query_head) with optional scores and provenance.

    Construct with any iterable of pairs; it is normalised to tuples and checked
    (non-negative ints, no duplicates, not empty, scores aligned and finite, indices
    inside the geometry when one is given). Use `dataclasses.replace` to derive one.
    """

    heads: tuple[Head, ...]
    scores: tuple[float, ...] | None = None
    model: str | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    method: str = "manual"
    data: str | None = None
    n_examples: int | None = None
    seed: int | None = None
    package_version: str = __version__
    command: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if isinstance(self.heads, (str, bytes)) or not isinstance(self.heads, Iterable):
            raise HeadSetError(f"heads must be a sequence of (layer, head) pairs, got {type(self.heads).__name__}")
        heads = tuple(_head_pair(h, f"head #{i}") for i, h in enumerate(self.heads))
        if not heads:
            raise HeadSetError("a head set needs at least one head")
        seen: dict[Head, int] = {}
        for i, h in enumerate(heads):
            if h in seen:
                raise HeadSetError(f"duplicate head {head_label(*h)} (positions {seen[h]} and {i})")
            seen[h] = i
        scores = self.scores
        if scores is not None:
            if isinstance(scores, (str, bytes, Mapping)) or not isinstance(scores, Iterable):
                raise HeadSetError(f"scores must be a sequence of numbers, got {type(scores).__name__}")
            scores = tuple(_score(s, f"score #{i}") for i, s in enumerate(scores))
            if len(scores) != len(heads):
                raise HeadSetError(f"{len(scores)} scores for {len(heads)} heads: they must have the same length")
        geo = {k: getattr(self, k) for k in ("n_layers", "n_heads", "n_kv_heads")}
        for k, v in geo.items():
            if v is not None:
                geo[k] = _positive_int(v, k)
        if (geo["n_layers"] is None) != (geo["n_heads"] is None):
            raise HeadSetError("give both n_layers and n_heads, or neither")
        if geo["n_kv_heads"] is not None and geo["n_heads"] is not None and geo["n_heads"] % geo["n_kv_heads"]:
            raise HeadSetError(f"n_heads ({geo['n_heads']}) is not a multiple of n_kv_heads ({geo['n_kv_heads']})")
        if not isinstance(self.method, str) or not self.method:
            raise HeadSetError(f"method must be a non-empty string, got {brief(self.method)}")
        if not isinstance(self.package_version, str):
            raise HeadSetError(f"package_version must be a string, got {brief(self.package_version)}")
        for k in ("model", "data", "command"):
            _opt_str(getattr(self, k), k)
        n_examples = None if self.n_examples is None else _nonneg_int(self.n_examples, "n_examples")
        seed = None if self.seed is None else _nonneg_int(self.seed, "seed")
        if not isinstance(self.extra, Mapping):
            raise HeadSetError(f"extra must be a mapping, got {type(self.extra).__name__}")
        # Frozen dataclass: normalised values go in through object.__setattr__.
        for k, v in dict(heads=heads, scores=scores, n_examples=n_examples, seed=seed,
                         extra=dict(self.extra), **geo).items():
            object.__setattr__(self, k, v)
        if self.n_layers is not None:
            self._check_in_range(Geometry(self.model, self.n_layers, self.n_heads, self.n_kv_heads))

    # ---- sequence behaviour

    def __len__(self) -> int:
        return len(self.heads)

    def __iter__(self) -> Iterator[Head]:
        return iter(self.heads)

    def __contains__(self, head: object) -> bool:
        return head in self.heads

    def __str__(self) -> str:
        shown = ", ".join(self.labels()[:6]) + (", ..." if len(self) > 6 else "")
        model = f", model={self.model}" if self.model else ""
        return f"HeadSet({len(self)} heads, method={self.method}{model}: {shown})"

    # ---- views

    @property
    def geometry(self) -> Geometry | None:
        if self.n_layers is None:
            return None
        return Geometry(self.model, self.n_layers, self.n_heads, self.n_kv_heads)

    @property
    def layers(self) -> tuple[int, ...]:
        """Distinct layers that hold a head, ascending."""
        return tuple(sorted({layer for layer, _ in self.heads}))

    @property
    def max_layer(self) -> int:
        """Deepest layer with a head: DySCO's partial pass runs layers 0..max_layer."""
        return max(layer for layer, _ in self.heads)

    def labels(self) -> list[str]:
        return [head_label(layer, head) for layer, head in self.heads]

    def by_layer(self) -> dict[int, list[int]]:
        """{layer: [heads]} (the form TransformerLens' head_detector accepts), layers ascending."""
        out: dict[int, list[int]] = {}
        for layer, head in sorted(self.heads):
            out.setdefault(layer, []).append(head)
        return out

    def as_tensor(self):
        """LongTensor [n, 2] of (layer, head) rows in set order, for indexing [layer, head] stacks."""
        import torch

        return torch.tensor(self.heads, dtype=torch.long)

    def mask(self, n_layers: int | None = None, n_heads: int | None = None):
        """Bool tensor [n_layers, n_heads], True at the set's heads (default: its own geometry)."""
        import torch

        n_layers = self.n_layers if n_layers is None else _positive_int(n_layers, "n_layers")
        n_heads = self.n_heads if n_heads is None else _positive_int(n_heads, "n_heads")
        if n_layers is None or n_heads is None:
            raise ConfigError("this head set records no geometry: pass n_layers and n_heads to mask()")
        self._check_in_range(Geometry(self.model, n_layers, n_heads))
        m = torch.zeros(n_layers, n_heads, dtype=torch.bool)
        idx = self.as_tensor()
        m[idx[:, 0], idx[:, 1]] = True
        return m

    def top(self, k: int) -> "HeadSet":
        """The first k heads (ranking order), provenance kept; k larger than the set is an error."""
        if not _is_intlike(k) or operator.index(k) < 1:
            raise ConfigError(f"top(k) needs an integer k >= 1, got {brief(k)}")
        k = operator.index(k)
        if k > len(self):
            raise ConfigError(f"top({k}) asked of a head set of {len(self)} heads")
        extra = dict(self.extra)
        extra.setdefault("top_k_of", len(self))
        return dataclasses.replace(
            self,
            heads=self.heads[:k],
            scores=None if self.scores is None else self.scores[:k],
            extra=extra,
        )

    def sorted_by_score(self) -> "HeadSet":
        """Descending by score; ties keep their current order."""
        if self.scores is None:
            raise ConfigError("this head set has no scores to sort by")
        order = sorted(range(len(self)), key=lambda i: -self.scores[i])
        return dataclasses.replace(
            self, heads=[self.heads[i] for i in order], scores=[self.scores[i] for i in order]
        )

    # ---- checks against a model

    def _check_in_range(self, geo: Geometry) -> None:
        for layer, head in self.heads:
            if layer >= geo.n_layers or head >= geo.n_heads:
                raise HeadSetError(
                    f"head {head_label(layer, head)} is out of range for {geo.name or 'a model'} "
                    f"({geo.describe()}): layers 0..{geo.n_layers - 1}, query heads 0..{geo.n_heads - 1}"
                )

    def validate_for(self, spec: Any, allow_other_model: bool = False) -> "HeadSet":
        """Check this set against a loaded model (ModelSpec, LoadedModel or geometry); returns self.

        Indices must be in range; a recorded geometry must equal the model's; a recorded
        model id must match (loosely, see `normalize_model_id`) unless allow_other_model.
        """
        geo = geometry_of(spec)
        mine = self.geometry
        same_geometry = mine is None or (
            (mine.n_layers, mine.n_heads) == (geo.n_layers, geo.n_heads)
            and (mine.n_kv_heads is None or geo.n_kv_heads is None or mine.n_kv_heads == geo.n_kv_heads)
        )
        same_name = (
            allow_other_model
            or self.model is None
            or geo.name is None
            or normalize_model_id(self.model) == normalize_model_id(geo.name)
        )
        if not (same_geometry and same_name):
            made = f"{self.model or 'an unnamed model'}" + (f" ({mine.describe()})" if mine else "")
            hint = "" if not same_geometry else "; pass allow_other_model=True if it is the same model"
            raise HeadModelMismatchError(
                f"head set made for model {made} but the loaded model is "
                f"{geo.name or 'unnamed'} ({geo.describe()}){hint}"
            )
        self._check_in_range(geo)
        return self

    # ---- our own JSON format

    def to_dict(self) -> dict[str, Any]:
        heads = []
        for i, (layer, head) in enumerate(self.heads):
            row: dict[str, Any] = {"layer": layer, "head": head, "label": head_label(layer, head)}
            if self.scores is not None:
                row["score"] = self.scores[i]
            heads.append(row)
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "model": self.model,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "method": self.method,
            "data": self.data,
            "n_examples": self.n_examples,
            "seed": self.seed,
            "package_version": self.package_version,
            "command": self.command,
            "heads": heads,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(
        cls, d: Any, spec: Any = None, allow_other_model: bool = False, source: str = "<dict>"
    ) -> "HeadSet":
        """Read our own format (as produced by to_dict), checking every field."""
        hs = _wrap(source, lambda: _ours_from_dict(_check_depth(d)))
        return hs if spec is None else _wrap(source, lambda: hs.validate_for(spec, allow_other_model))

    def to_json(self, path: str | os.PathLike) -> Path:
        """Write our JSON format atomically (temp file + rename); returns the path."""
        path = Path(path)
        try:
            text = json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"
        except (TypeError, ValueError) as e:
            raise HeadSetError(f"head set cannot be written as JSON (check `extra`): {e}") from e
        with atomic_open(path) as f:
            f.write(text)
        return path

    @classmethod
    def from_json(cls, path: str | os.PathLike, spec: Any = None, allow_other_model: bool = False) -> "HeadSet":
        """Read a head file in our JSON format; with `spec`, check it against that model."""
        path = Path(path)
        obj = _read_json(path)
        return cls.from_dict(obj, spec=spec, allow_other_model=allow_other_model, source=str(path))


# --------------------------------------------------------------------------- parsing helpers


def _wrap(source: str, fn):
    """Run a parser; a HeadSetError comes out naming the source (a mismatch keeps its class)."""
    try:
        return fn()
    except HeadFileError:
        raise  # already names its source
    except HeadModelMismatchError as e:
        raise HeadModelMismatchError(f"{source}: {e}") from None
    except HeadSetError as e:
        raise HeadFileError(f"{source}: {e}") from None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise HeadSetError(f"duplicate key {brief(k)}")
        out[k] = v
    return out


def _reject_constant(name: str) -> Any:
    raise HeadSetError(f"{name} is not a valid number in a head file")


# Every head format nests at most five levels (our `extra` holds the score matrix); a file
# that nests far deeper is not a head file, and deep values would overflow the stack later.
MAX_DEPTH = 32


def _check_depth(obj: Any) -> Any:
    """HeadSetError when containers nest deeper than MAX_DEPTH; iterative, so any depth is safe."""
    stack, seen = [(obj, 1)], set()
    while stack:
        x, depth = stack.pop()
        if not isinstance(x, (list, tuple, Mapping)) or id(x) in seen:
            continue
        if depth > MAX_DEPTH:
            raise HeadSetError(f"values nest more than {MAX_DEPTH} levels deep; not a head file")
        seen.add(id(x))
        children = list(x.keys()) + list(x.values()) if isinstance(x, Mapping) else x
        stack.extend((c, depth + 1) for c in children)
    return obj


def _parse_json_text(text: str, source: str) -> Any:
    def parse() -> Any:
        try:
            obj = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant)
        except json.JSONDecodeError as e:
            raise HeadSetError(f"not valid JSON: {e}") from None
        except RecursionError:
            raise HeadSetError(f"values nest more than {MAX_DEPTH} levels deep; not a head file") from None
        return _check_depth(obj)

    return _wrap(source, parse)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HeadFileError(f"head file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise HeadFileError(f"cannot read head file {path}: {e}") from None


def _read_json(path: Path) -> Any:
    return _parse_json_text(_read_text(path), str(path))


def _parse_yaml_text(text: str, source: str) -> Any:
    try:
        import yaml
    except ImportError as e:  # pragma: no cover - PyYAML comes with transformers
        raise HeadFileError(f"{source}: reading YAML needs PyYAML (pip install pyyaml)") from e

    class _StrictSafeLoader(yaml.SafeLoader):
        """SafeLoader (no python/* tags: nothing is constructed or run) that refuses duplicate
        and unhashable keys (a list as a key would otherwise be a TypeError, not a file error)."""

        def construct_mapping(self, node, deep=False):
            keys = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in keys
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"unhashable key {brief(key)}", key_node.start_mark
                    ) from None
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {brief(key)}", key_node.start_mark
                    )
                keys.add(key)
            return super().construct_mapping(node, deep=deep)

    try:
        obj = yaml.load(text, Loader=_StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise HeadFileError(f"{source}: values nest more than {MAX_DEPTH} levels deep; not a head file") from None
    except yaml.YAMLError as e:
        tagged = "python/" in str(e)
        why = " (python-specific tags such as !!python/tuple are refused; write [layer, head])" if tagged else ""
        raise HeadFileError(f"{source}: not valid safe YAML{why}: {_yaml_problem(e)}") from None
    return _wrap(source, lambda: _check_depth(obj))


def _yaml_problem(error) -> str:
    """PyYAML's message on one line: the problem and where it is (its str() spans several lines)."""
    problem = getattr(error, "problem", None) or getattr(error, "context", None)
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    if problem is None:
        return " ".join(str(error).split())
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise HeadSetError(msg)


# --------------------------------------------------------------------------- our format


_OURS_KEYS = {
    "format", "format_version", "model", "n_layers", "n_heads", "n_kv_heads", "method", "data",
    "n_examples", "seed", "package_version", "command", "heads", "extra",
}
_OURS_REQUIRED = {"format", "format_version", "heads", "method", "package_version"}


def _ours_from_dict(d: Any) -> HeadSet:
    _require(isinstance(d, Mapping), f"expected a JSON object (our head file format), got {type(d).__name__}")
    _require(d.get("format") == FORMAT, f"'format' must be {FORMAT!r}, got {brief(d.get('format'))}")
    version = d.get("format_version")
    _require(_is_intlike(version), f"'format_version' must be an integer, got {brief(version)}")
    _require(version >= 1, f"'format_version' must be 1 or more, got {version}")
    _require(
        version <= FORMAT_VERSION,
        f"format_version {version} is newer than this dysco-interp reads ({FORMAT_VERSION}); upgrade it",
    )
    unknown = set(d) - _OURS_KEYS
    _require(not unknown, f"unknown field(s) {sorted(map(str, unknown))}; known: {sorted(_OURS_KEYS)}")
    missing = _OURS_REQUIRED - set(d)
    _require(not missing, f"missing field(s) {sorted(missing)}")
    rows = d["heads"]
    _require(isinstance(rows, list), f"'heads' must be a list, got {type(rows).__name__}")
    _require(len(rows) > 0, "'heads' is an empty list")
    heads, scores = [], []
    for i, row in enumerate(rows):
        _require(isinstance(row, Mapping), f"heads[{i}] must be an object with layer/head, got {brief(row)}")
        extra_keys = set(row) - {"layer", "head", "label", "score"}
        _require(not extra_keys, f"heads[{i}] has unknown field(s) {sorted(map(str, extra_keys))}")
        _require("layer" in row and "head" in row, f"heads[{i}] needs 'layer' and 'head'")
        layer = _nonneg_int(row["layer"], f"heads[{i}].layer")
        head = _nonneg_int(row["head"], f"heads[{i}].head")
        if "label" in row:
            _require(
                row["label"] == head_label(layer, head),
                f"heads[{i}].label {brief(row['label'])} disagrees with layer {layer}, head {head}",
            )
        heads.append((layer, head))
        scores.append(row.get("score"))
    has_score = [s is not None for s in scores]
    _require(all(has_score) or not any(has_score), "either every head has a 'score' or none does")
    extra = d.get("extra", {})
    _require(isinstance(extra, Mapping), f"'extra' must be an object, got {type(extra).__name__}")
    return HeadSet(
        heads=heads,
        scores=scores if all(has_score) else None,
        model=d.get("model"),
        n_layers=d.get("n_layers"),
        n_heads=d.get("n_heads"),
        n_kv_heads=d.get("n_kv_heads"),
        method=d["method"],
        data=d.get("data"),
        n_examples=d.get("n_examples"),
        seed=d.get("seed"),
        package_version=d["package_version"],
        command=d.get("command"),
        extra=extra,
    )


# --------------------------------------------------------------------------- public formats


def _pick_model_entry(d: Mapping, spec: Any, what: str) -> tuple[str, Any]:
    """From {model name: value}, the entry for `spec`'s model, or the only entry."""
    _require(len(d) > 0, f"empty mapping: expected {what}")
    for k in d:
        _require(isinstance(k, str), f"mapping keys must be model names (strings), got {brief(k)}")
    if spec is not None:
        name = geometry_of(spec).name
        if name is not None:
            hits = [k for k in d if normalize_model_id(k) == normalize_model_id(name)]
            if len(hits) == 1:
                return hits[0], d[hits[0]]
            if len(d) > 1:
                raise HeadSetError(f"no entry for model {name!r}; entries: {sorted(d)}")
    if len(d) == 1:
        k = next(iter(d))
        return k, d[k]
    raise HeadSetError(f"several models in the file ({sorted(d)}): pass spec= to choose one")


def _qrhead_pairs(obj: Any) -> tuple[list[Head], list[float]]:
    _require(isinstance(obj, list), f"QRHead JSON must be a list of [\"layer-head\", score], got {type(obj).__name__}")
    _require(len(obj) > 0, "empty head list")
    heads, scores = [], []
    for i, item in enumerate(obj):
        _require(
            isinstance(item, list) and len(item) == 2 and isinstance(item[0], str),
            f"entry #{i} must be [\"layer-head\", score], got {brief(item)}",
        )
        heads.append(parse_head_label(item[0]))
        scores.append(_score(item[1], f"score of entry #{i} ({item[0]})"))
    return heads, scores


def _qrhead_string(text: Any) -> list[Head]:
    _require(isinstance(text, str), f"QRHead head set must be a string 'L-H,L-H,...', got {type(text).__name__}")
    _require(text.strip() != "", "empty head list")
    if text.strip() == "full_heads":
        raise HeadSetError("'full_heads' means every head (QRHead's full-head retriever), not a head set")
    parts = text.split(",")
    for i, p in enumerate(parts):
        _require(p.strip() != "", f"empty entry #{i} in head string {brief(text)}")
    return [parse_head_label(p) for p in parts]


def _qrhead_yaml(obj: Any, spec: Any) -> tuple[list[Head], str | None]:
    """A plain string, QRHead's config mapping (attn_head_set: ...), or {model: string}."""
    if isinstance(obj, str):
        return _qrhead_string(obj), None
    _require(isinstance(obj, Mapping), f"expected a 'L-H,...' string or a mapping, got {type(obj).__name__}")
    if "attn_head_set" in obj:
        model = obj.get("model_name_or_path") or obj.get("model_base_class")
        return _qrhead_string(obj["attn_head_set"]), _opt_str(model, "model_name_or_path")
    model, text = _pick_model_entry(obj, spec, "model name -> 'L-H,...' string")
    return _qrhead_string(text), model


def _dysco_list(obj: Any, spec: Any) -> tuple[list[Head], str | None]:
    """A list of [layer, head] pairs or '(layer, head)' strings, bare or under one key."""
    model = None
    if isinstance(obj, Mapping):
        if "heads" in obj and isinstance(obj["heads"], list):
            obj = obj["heads"]
        else:
            model, obj = _pick_model_entry(obj, spec, "model name -> list of [layer, head]")
    _require(isinstance(obj, list), f"expected a list of [layer, head] pairs, got {type(obj).__name__}")
    _require(len(obj) > 0, "empty head list")
    heads = []
    for i, item in enumerate(obj):
        _require(
            isinstance(item, (list, str)),
            f"entry #{i} must be [layer, head] or '(layer, head)', got {type(item).__name__} {brief(item)}",
        )
        heads.append(_head_pair(item, f"entry #{i}"))
    return heads, model


def _retrieval_head(obj: Any) -> tuple[list[Head], list[float], int | None]:
    """{'L-H': [score per example]} -> heads ranked by mean score (ties keep file order)."""
    _require(
        isinstance(obj, Mapping),
        f"Retrieval_Head JSON must be an object {{\"layer-head\": [scores]}}, got {type(obj).__name__}",
    )
    _require(len(obj) > 0, "empty head mapping")
    rows = []
    lengths = set()
    for label, vals in obj.items():
        head = parse_head_label(label)
        _require(isinstance(vals, list), f"scores of {brief(label)} must be a list of numbers, got {brief(vals)}")
        _require(len(vals) > 0, f"scores of {brief(label)} are an empty list")
        nums = [_score(v, f"score #{j} of {brief(label)}") for j, v in enumerate(vals)]
        lengths.add(len(nums))
        rows.append((head, math.fsum(nums) / len(nums)))
    rows.sort(key=lambda r: -r[1])  # stable: ties keep file order
    n_examples = lengths.pop() if len(lengths) == 1 else None
    return [h for h, _ in rows], [s for _, s in rows], n_examples


# --------------------------------------------------------------------------- load_heads


def _sniff(obj: Any) -> str:
    """Which format a parsed object is in."""
    if isinstance(obj, str):
        return FMT_QRHEAD_YAML
    if isinstance(obj, Mapping):
        if "format" in obj:
            return FMT_OURS
        if "attn_head_set" in obj:
            return FMT_QRHEAD_YAML
        if "heads" in obj:
            return FMT_DYSCO_YAML
        if not obj:
            raise HeadSetError("empty mapping: no heads")
        if all(_is_label(k) for k in obj):
            return FMT_RETRIEVAL_HEAD
        values = list(obj.values())
        if all(isinstance(v, str) for v in values):
            return FMT_QRHEAD_YAML  # {model: "L-H,..."}
        if all(isinstance(v, list) for v in values):
            return FMT_DYSCO_YAML  # {model: [[layer, head], ...]}
    if isinstance(obj, list):
        _require(len(obj) > 0, "empty head list")
        first = obj[0]
        if isinstance(first, list) and len(first) == 2 and isinstance(first[0], str):
            return FMT_QRHEAD_JSON
        return FMT_DYSCO_YAML
    raise HeadSetError(
        f"unrecognised head file content ({type(obj).__name__}); accepted formats: {', '.join(FORMATS)}"
    )


def _is_label(x: Any) -> bool:
    try:
        parse_head_label(x)
    except HeadSetError:
        return False
    return True


def _from_parsed(obj: Any, fmt: str, spec: Any, source_name: str | None) -> HeadSet:
    imported_from = {"source_file": source_name} if source_name else {}
    data = f"imported from {source_name}" if source_name else "imported"
    if fmt == FMT_OURS:
        return _ours_from_dict(obj)
    if fmt == FMT_QRHEAD_JSON:
        heads, scores = _qrhead_pairs(obj)
        return HeadSet(heads, scores, method=f"imported:{fmt}", data=data, extra=imported_from)
    if fmt == FMT_QRHEAD_YAML:
        heads, model = _qrhead_yaml(obj, spec)
        return HeadSet(heads, model=model, method=f"imported:{fmt}", data=data, extra=imported_from)
    if fmt == FMT_DYSCO_YAML:
        heads, model = _dysco_list(obj, spec)
        return HeadSet(heads, model=model, method=f"imported:{fmt}", data=data, extra=imported_from)
    if fmt == FMT_RETRIEVAL_HEAD:
        heads, scores, n_examples = _retrieval_head(obj)
        return HeadSet(
            heads, scores, method=f"imported:{fmt}", data=data, n_examples=n_examples,
            extra={**imported_from, "ranked_by": "mean score over examples"},
        )
    raise AssertionError(fmt)


def _resolve_fmt(fmt: str | None) -> str | None:
    if fmt is None:
        return None
    key = _FMT_ALIASES.get(fmt, fmt)
    if key not in FORMATS:
        raise ConfigError(f"unknown head file format {brief(fmt)}; use one of {', '.join(FORMATS)}")
    return key


def load_heads(
    path_or_obj: Any,
    spec: Any = None,
    fmt: str | None = None,
    top_k: int | None = None,
    allow_other_model: bool = False,
) -> HeadSet:
    """Read a head set from a file, a parsed object, a 'L-H,...' string or a HeadSet.

    The format is `fmt` (one of FORMATS) or sniffed: by extension (.json, .yaml/.yml),
    then by content. With `spec` (ModelSpec, LoadedModel or geometry) indices are
    checked against the model, an imported set records the model's geometry, and a
    file made for another model is a HeadModelMismatchError. `top_k` keeps the first
    k heads of the ranking.
    """
    fmt = _resolve_fmt(fmt)
    source, source_name = f"<{type(path_or_obj).__name__}>", None
    obj = path_or_obj
    if isinstance(path_or_obj, HeadSet):
        hs = path_or_obj
    else:
        path = _as_existing_path(path_or_obj)
        if path is not None:
            source, source_name = str(path), path.name
            text = _read_text(path)
            ext = path.suffix.lower()
            if ext in (".yaml", ".yml") or (ext != ".json" and fmt in (FMT_QRHEAD_YAML, FMT_DYSCO_YAML)):
                obj = _parse_yaml_text(text, source)
            elif ext == ".json" or fmt is not None:
                obj = _parse_json_text(text, source)
            else:
                raise HeadFileError(f"{path}: unknown extension {brief(ext)}: use .json or .yaml, or pass fmt=")
        elif isinstance(path_or_obj, (str, os.PathLike)) and _looks_like_path(path_or_obj):
            raise HeadFileError(f"head file not found: {path_or_obj}")
        elif isinstance(path_or_obj, str):
            source = "<string>"
        hs = _wrap(source, lambda: _from_parsed(_check_depth(obj), fmt or _sniff(obj), spec, source_name))
    if spec is not None:
        hs = _wrap(source, lambda: _adopt_geometry(hs, spec, allow_other_model))
    if top_k is not None:
        hs = hs.top(top_k)
    return hs


def _as_existing_path(x: Any) -> Path | None:
    if isinstance(x, os.PathLike) or (isinstance(x, str) and "\n" not in x and len(x) < 4096):
        p = Path(x)
        try:
            return p if p.is_file() else None
        except OSError:
            return None
    return None


def _looks_like_path(x: Any) -> bool:
    if isinstance(x, os.PathLike):
        return True
    return bool(re.search(r"[\\/]|\.(json|ya?ml)$", x.strip(), re.IGNORECASE))


def _adopt_geometry(hs: HeadSet, spec: Any, allow_other_model: bool) -> HeadSet:
    """Validate against the model; an imported set without geometry takes the model's."""
    hs.validate_for(spec, allow_other_model)
    geo = geometry_of(spec)
    if hs.geometry is not None:
        return hs
    extra = dict(hs.extra)
    if hs.model and geo.name and hs.model != geo.name:
        extra.setdefault("source_model", hs.model)
    return dataclasses.replace(
        hs, model=geo.name or hs.model, n_layers=geo.n_layers, n_heads=geo.n_heads,
        n_kv_heads=geo.n_kv_heads, extra=extra,
    )


# --------------------------------------------------------------------------- random heads


def random_heads(
    n: int, n_layers: int, n_heads: int, seed: int, exclude: Iterable[Head] | None = None
) -> list[Head]:
    """n distinct (layer, head) drawn uniformly with `seed` (same seed, same heads), minus `exclude`."""
    n = _positive_int(n, "n")
    n_layers, n_heads = _positive_int(n_layers, "n_layers"), _positive_int(n_heads, "n_heads")
    seed = _nonneg_int(seed, "seed")
    banned = {_head_pair(h, "excluded head") for h in (exclude or ())}
    pool = [(layer, head) for layer in range(n_layers) for head in range(n_heads) if (layer, head) not in banned]
    if n > len(pool):
        raise ConfigError(f"cannot draw {n} distinct heads from {len(pool)} available ({n_layers} x {n_heads})")
    # random.Random(seed).sample is stable across Python versions for int seeds.
    return random.Random(seed).sample(pool, n)


def random_like(
    headset: HeadSet, spec_or_geometry: Any = None, seed: int = 0, exclude_original: bool = False
) -> HeadSet:
    """A seeded random head set of the same size (the random-heads ablation).

    Geometry comes from `spec_or_geometry` or, if omitted, from the head set itself.
    `exclude_original` draws only heads outside `headset`.
    """
    geo = geometry_of(spec_or_geometry if spec_or_geometry is not None else headset)
    heads = random_heads(
        len(headset), geo.n_layers, geo.n_heads, seed, exclude=headset.heads if exclude_original else None
    )
    return HeadSet(
        heads,
        model=geo.name if geo.name is not None else headset.model,
        n_layers=geo.n_layers,
        n_heads=geo.n_heads,
        n_kv_heads=geo.n_kv_heads,
        method="random",
        data=f"uniform draw of {len(headset)} heads, size of a {headset.method} set",
        seed=seed,
        extra={"like_method": headset.method, "exclude_original": exclude_original},
    )


# --------------------------------------------------------------------------- shipped and paper heads


_HEAD_FILES_DIR = "head_files"


def available_shipped_heads() -> list[str]:
    """Aliases with a packaged head file (dysco_interp/head_files/<alias>.json)."""
    try:
        folder = resources.files("dysco_interp").joinpath(_HEAD_FILES_DIR)
        if not folder.is_dir():
            return []
        return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))
    except (FileNotFoundError, NotADirectoryError, ModuleNotFoundError):
        return []


def shipped_heads(alias: str, spec: Any = None, allow_other_model: bool = False) -> HeadSet:
    """The packaged head set for a model alias; a clear error lists the available ones."""
    if not isinstance(alias, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", alias) or alias.startswith("."):
        raise ConfigError(f"invalid head-file alias {brief(alias)}")
    available = available_shipped_heads()
    if alias not in available:
        listed = ", ".join(available) if available else "none yet (run `dysco-interp detect-heads`)"
        raise HeadFileError(f"no shipped head file for {brief(alias)}; available: {listed}")
    resource = resources.files("dysco_interp").joinpath(_HEAD_FILES_DIR, f"{alias}.json")
    source = f"dysco_interp/{_HEAD_FILES_DIR}/{alias}.json"
    obj = _parse_json_text(resource.read_text(encoding="utf-8"), source)
    return HeadSet.from_dict(obj, spec=spec, allow_other_model=allow_other_model, source=source)


# The official DySCO defaults (0-indexed (layer, query_head), ranking order); the same
# list as QRHead's Qwen3-8B_qr_head_NQ config.
_PAPER_HEADS: dict[str, dict[str, Any]] = {
    "qwen3-8b": dict(
        heads=(
            (21, 31), (21, 18), (20, 15), (22, 4), (21, 11), (20, 16), (21, 17), (19, 13),
            (21, 10), (21, 8), (18, 5), (20, 14), (19, 14), (24, 13), (17, 4), (19, 28),
        ),
        model="Qwen/Qwen3-8B",
        n_layers=36,
        n_heads=32,
        n_kv_heads=8,
        method="imported:dysco-official",
        data="DySCO release defaults for Qwen3-8B (QRHead detection; QRHead config Qwen3-8B_qr_head_NQ)",
    ),
}


def paper_heads(model: str = "qwen3-8b") -> HeadSet:
    """The head set the DySCO release ships for `model` (only Qwen3-8B is recorded)."""
    key = normalize_model_id(model) if isinstance(model, str) else None
    if key not in _PAPER_HEADS:
        raise ConfigError(f"no DySCO paper head list for {brief(model)}; known: {', '.join(sorted(_PAPER_HEADS))}")
    return HeadSet(**_PAPER_HEADS[key])


__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "FORMATS",
    "Geometry",
    "HeadFileError",
    "HeadModelMismatchError",
    "HeadSet",
    "HeadSetError",
    "available_shipped_heads",
    "geometry_of",
    "head_label",
    "load_heads",
    "normalize_model_id",
    "paper_heads",
    "parse_head_label",
    "random_heads",
    "random_like",
    "shipped_heads",
]
