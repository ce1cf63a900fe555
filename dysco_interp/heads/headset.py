"""HeadSet: an ordered set of attention heads with scores and provenance, and its own JSON format.

A head is `(layer, query_head)`, 0-indexed, in TransformerLens conventions: under
GQA the index is the *query* head (head h reads KV head h // group), labels are
`L{l}H{h}`. Order is ranking order (best first) when the set comes from a detector.

Our JSON format (`format: dysco-interp/heads`) records the geometry and provenance; its
writer (`HeadSet.to_dict`) and reader (`headset_from_dict`) live here, beside the class.
The public formats of other projects are read in `formats.py`.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from dysco_interp import __version__
from dysco_interp.atomic import atomic_open
from dysco_interp.checks import brief, is_int
from dysco_interp.errors import ConfigError
from dysco_interp.heads.detected_on import DetectionData
from dysco_interp.heads.errors import HeadModelMismatchError, HeadSetError
from dysco_interp.heads.safe_parse import check_depth, naming_source, parse_json_text, read_json
from dysco_interp.heads.values import head_pair, nonneg_int, optional_str, positive_int, require, score
from dysco_interp.hooks import Head, head_label, head_out_of_range

FORMAT = "dysco-interp/heads"
# 2 added `detected_on`; version 1 files read as before
FORMAT_VERSION = 2


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
        vals = [positive_int(v, "geometry value") for v in obj]
        return Geometry(None, vals[0], vals[1], vals[2] if len(vals) == 3 else None)
    if hasattr(obj, "n_layers") and hasattr(obj, "n_heads"):
        kv = getattr(obj, "n_kv_heads", None)
        return Geometry(
            getattr(obj, "name", None),
            positive_int(obj.n_layers, "n_layers"),
            positive_int(obj.n_heads, "n_heads"),
            None if kv is None else positive_int(kv, "n_kv_heads"),
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


# --------------------------------------------------------------------------- HeadSet


@dataclass(frozen=True)
class HeadSet:
    """An ordered set of (layer, query_head) with optional scores and provenance.

    Construct with any iterable of pairs; it is normalised to tuples and checked
    (non-negative ints, no duplicates, not empty, scores aligned and finite, indices
    inside the geometry when one is given). Use `dataclasses.replace` to derive one.
    """

    # any sequence goes in; __post_init__ stores tuples
    heads: Sequence[Head]
    scores: Sequence[float] | None = None
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
    # the task instances the heads were detected on, per task and data seed (empty: not recorded)
    detected_on: tuple[DetectionData, ...] = field(default=(), hash=False)

    def __post_init__(self) -> None:
        if isinstance(self.heads, (str, bytes)) or not isinstance(self.heads, Iterable):
            raise HeadSetError(f"heads must be a sequence of (layer, head) pairs, got {type(self.heads).__name__}")
        heads = tuple(head_pair(h, f"head #{i}") for i, h in enumerate(self.heads))
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
            scores = tuple(score(s, f"score #{i}") for i, s in enumerate(scores))
            if len(scores) != len(heads):
                raise HeadSetError(f"{len(scores)} scores for {len(heads)} heads: they must have the same length")
        geo = {k: getattr(self, k) for k in ("n_layers", "n_heads", "n_kv_heads")}
        for k, v in geo.items():
            if v is not None:
                geo[k] = positive_int(v, k)
        if (geo["n_layers"] is None) != (geo["n_heads"] is None):
            raise HeadSetError("give both n_layers and n_heads, or neither")
        if geo["n_kv_heads"] is not None and geo["n_heads"] is not None and geo["n_heads"] % geo["n_kv_heads"]:
            raise HeadSetError(f"n_heads ({geo['n_heads']}) is not a multiple of n_kv_heads ({geo['n_kv_heads']})")
        if not isinstance(self.method, str) or not self.method:
            raise HeadSetError(f"method must be a non-empty string, got {brief(self.method)}")
        if not isinstance(self.package_version, str):
            raise HeadSetError(f"package_version must be a string, got {brief(self.package_version)}")
        for k in ("model", "data", "command"):
            optional_str(getattr(self, k), k)
        n_examples = None if self.n_examples is None else nonneg_int(self.n_examples, "n_examples")
        seed = None if self.seed is None else nonneg_int(self.seed, "seed")
        if not isinstance(self.extra, Mapping):
            raise HeadSetError(f"extra must be a mapping, got {type(self.extra).__name__}")
        detected_on = tuple(self.detected_on)
        if not all(isinstance(d, DetectionData) for d in detected_on):
            raise HeadSetError("detected_on must hold DetectionData (heads.detected_on.detection_data makes them)")
        # Frozen dataclass: normalised values go in through object.__setattr__.
        for k, v in dict(heads=heads, scores=scores, n_examples=n_examples, seed=seed,
                         extra=dict(self.extra), detected_on=detected_on, **geo).items():
            object.__setattr__(self, k, v)
        geometry = self.geometry
        if geometry is not None:
            self._check_in_range(geometry)

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
        if self.n_layers is None or self.n_heads is None:  # both or neither, see __post_init__
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

        n_layers = self.n_layers if n_layers is None else positive_int(n_layers, "n_layers")
        n_heads = self.n_heads if n_heads is None else positive_int(n_heads, "n_heads")
        if n_layers is None or n_heads is None:
            raise ConfigError("this head set records no geometry: pass n_layers and n_heads to mask()")
        self._check_in_range(Geometry(self.model, n_layers, n_heads))
        m = torch.zeros(n_layers, n_heads, dtype=torch.bool)
        idx = self.as_tensor()
        m[idx[:, 0], idx[:, 1]] = True
        return m

    def top(self, k: int) -> "HeadSet":
        """The first k heads (ranking order), provenance kept; k larger than the set is an error."""
        if not is_int(k) or operator.index(k) < 1:
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
        scores = self.scores
        if scores is None:
            raise ConfigError("this head set has no scores to sort by")
        order = sorted(range(len(self)), key=lambda i: -scores[i])
        return dataclasses.replace(
            self, heads=[self.heads[i] for i in order], scores=[scores[i] for i in order]
        )

    # ---- checks against a model

    def _check_in_range(self, geo: Geometry) -> None:
        for layer, head in self.heads:
            if head_out_of_range((layer, head), geo.n_layers, geo.n_heads):
                raise HeadSetError(
                    f"head {head_label(layer, head)} is out of range for {geo.name or 'a model'} "
                    f"({geo.describe()}): layers 0..{geo.n_layers - 1}, query heads 0..{geo.n_heads - 1}"
                )

    def validate_for(self, spec: Any, allow_other_model: bool = False) -> "HeadSet":
        """Check this set against a loaded model (LoadedModel, ModelSpec or geometry); returns self.

        Indices must be in range; a recorded geometry must equal the model's; a recorded
        model id must match (loosely, see `normalize_model_id`) unless allow_other_model.
        Given the LoadedModel, another id is accepted when the model holds the weights that
        id refers to (`models.recognise`): an alias's converted folder, or a copy of it, fits
        the alias's head files; another model of the same geometry is still refused.
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
        if same_geometry and not same_name:
            from dysco_interp.models.recognise import same_weights

            same_name = same_weights(self.model, spec)
        if not (same_geometry and same_name):
            made = f"{self.model or 'an unnamed model'}" + (f" ({mine.describe()})" if mine else "")
            hint = "" if not same_geometry else (
                "; to use them on it anyway, load them with load_heads(file, model, allow_other_model=True) "
                f"(command line: --allow-other-model) or set the file's \"model\" to {geo.name!r}")
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
            "detected_on": [d.to_dict() for d in self.detected_on],
            "heads": heads,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(
        cls, d: Any, spec: Any = None, allow_other_model: bool = False, source: str = "<dict>"
    ) -> "HeadSet":
        """Read our own format (as produced by to_dict), checking every field."""
        hs = naming_source(source, lambda: headset_from_dict(check_depth(d)))
        return hs if spec is None else naming_source(source, lambda: hs.validate_for(spec, allow_other_model))

    @overload
    def to_json(self, path: None = None) -> str: ...

    @overload
    def to_json(self, path: str | os.PathLike) -> Path: ...

    def to_json(self, path: str | os.PathLike | None = None) -> str | Path:
        """Our JSON format: with `path`, written atomically (temp file + rename) and the path
        returned; without, the text itself (what the file would hold; read it back with
        `HeadSet.from_json_text`)."""
        try:
            text = json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"
        except (TypeError, ValueError) as e:
            raise HeadSetError(f"head set cannot be written as JSON (check `extra`): {e}") from e
        if path is None:
            return text
        path = Path(path)
        with atomic_open(path) as f:
            f.write(text)
        return path

    @classmethod
    def from_json_text(
        cls, text: str, spec: Any = None, allow_other_model: bool = False, source: str = "<JSON text>"
    ) -> "HeadSet":
        """Read our JSON format from a string (as `to_json()` gives); with `spec`, check it."""
        obj = parse_json_text(text, source)
        return cls.from_dict(obj, spec=spec, allow_other_model=allow_other_model, source=source)

    @classmethod
    def from_json(cls, path: str | os.PathLike, spec: Any = None, allow_other_model: bool = False) -> "HeadSet":
        """Read a head file in our JSON format; with `spec`, check it against that model."""
        path = Path(path)
        obj = read_json(path)
        return cls.from_dict(obj, spec=spec, allow_other_model=allow_other_model, source=str(path))


# --------------------------------------------------------------------------- our format


_OURS_KEYS = {
    "format", "format_version", "model", "n_layers", "n_heads", "n_kv_heads", "method", "data",
    "n_examples", "seed", "package_version", "command", "heads", "extra", "detected_on",
}
_OURS_REQUIRED = {"format", "format_version", "heads", "method", "package_version"}


def headset_from_dict(d: Any) -> HeadSet:
    """A HeadSet from our format's object, every field checked (HeadSet.from_dict adds the source to errors)."""
    require(isinstance(d, Mapping), f"expected a JSON object (our head file format), got {type(d).__name__}")
    require(d.get("format") == FORMAT, f"'format' must be {FORMAT!r}, got {brief(d.get('format'))}")
    version = d.get("format_version")
    require(is_int(version), f"'format_version' must be an integer, got {brief(version)}")
    require(version >= 1, f"'format_version' must be 1 or more, got {version}")
    require(
        version <= FORMAT_VERSION,
        f"format_version {version} is newer than this dysco-interp reads ({FORMAT_VERSION}); upgrade it",
    )
    unknown = set(d) - _OURS_KEYS
    require(not unknown, f"unknown field(s) {sorted(map(str, unknown))}; known: {sorted(_OURS_KEYS)}")
    missing = _OURS_REQUIRED - set(d)
    require(not missing, f"missing field(s) {sorted(missing)}")
    rows = d["heads"]
    require(isinstance(rows, list), f"'heads' must be a list, got {type(rows).__name__}")
    require(len(rows) > 0, "'heads' is an empty list")
    heads, scores = [], []
    for i, row in enumerate(rows):
        require(isinstance(row, Mapping), f"heads[{i}] must be an object with layer/head, got {brief(row)}")
        extra_keys = set(row) - {"layer", "head", "label", "score"}
        require(not extra_keys, f"heads[{i}] has unknown field(s) {sorted(map(str, extra_keys))}")
        require("layer" in row and "head" in row, f"heads[{i}] needs 'layer' and 'head'")
        layer = nonneg_int(row["layer"], f"heads[{i}].layer")
        head = nonneg_int(row["head"], f"heads[{i}].head")
        if "label" in row:
            require(
                row["label"] == head_label(layer, head),
                f"heads[{i}].label {brief(row['label'])} disagrees with layer {layer}, head {head}",
            )
        heads.append((layer, head))
        scores.append(row.get("score"))
    has_score = [s is not None for s in scores]
    require(all(has_score) or not any(has_score), "either every head has a 'score' or none does")
    extra = d.get("extra", {})
    require(isinstance(extra, Mapping), f"'extra' must be an object, got {type(extra).__name__}")
    detected_on = d.get("detected_on", [])
    require(isinstance(detected_on, list), f"'detected_on' must be a list, got {type(detected_on).__name__}")
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
        detected_on=tuple(DetectionData.from_dict(x, f"detected_on[{i}]") for i, x in enumerate(detected_on)),
    )
