"""Head files: `load_heads` and the readers of every format it accepts.

- our own JSON (`format: dysco-interp/heads`), with geometry and provenance, checked
  against the loaded model (read by `headset.headset_from_dict`);
- QRHead's JSON `[["L-H", score], ...]` and its string/YAML form `"L-H,L-H"` (bare, in
  its config mapping, or `{model: string}`), DySCO's YAML list of (layer, head) pairs,
  and Retrieval_Head's JSON `{"L-H": [score per example]}`.

Nothing here unpickles or evals (see `safe_parse`), and every value is type-checked.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dysco_interp.checks import brief
from dysco_interp.errors import ConfigError
from dysco_interp.heads.errors import HeadFileError, HeadSetError
from dysco_interp.heads.headset import HeadSet, geometry_of, headset_from_dict, normalize_model_id
from dysco_interp.heads.safe_parse import check_depth, naming_source, parse_json_text, parse_yaml_text, read_text
from dysco_interp.heads.values import head_pair, is_head_label, optional_str, parse_head_label, require, score
from dysco_interp.hooks import Head

# Names accepted by `load_heads(fmt=...)`.
FMT_OURS = "dysco-interp"
FMT_QRHEAD_JSON = "qrhead-json"
FMT_QRHEAD_YAML = "qrhead-yaml"
FMT_DYSCO_YAML = "dysco-yaml"
FMT_RETRIEVAL_HEAD = "retrieval-head-json"
FORMATS = (FMT_OURS, FMT_QRHEAD_JSON, FMT_QRHEAD_YAML, FMT_DYSCO_YAML, FMT_RETRIEVAL_HEAD)
_FMT_ALIASES = {"qrhead-string": FMT_QRHEAD_YAML, "ours": FMT_OURS, "json": FMT_OURS}


# --------------------------------------------------------------------------- public formats


def _pick_model_entry(d: Mapping, spec: Any, what: str) -> tuple[str, Any]:
    """From {model name: value}, the entry for `spec`'s model, or the only entry."""
    require(len(d) > 0, f"empty mapping: expected {what}")
    for k in d:
        require(isinstance(k, str), f"mapping keys must be model names (strings), got {brief(k)}")
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
    require(isinstance(obj, list), f"QRHead JSON must be a list of [\"layer-head\", score], got {type(obj).__name__}")
    require(len(obj) > 0, "empty head list")
    heads, scores = [], []
    for i, item in enumerate(obj):
        require(
            isinstance(item, list) and len(item) == 2 and isinstance(item[0], str),
            f"entry #{i} must be [\"layer-head\", score], got {brief(item)}",
        )
        heads.append(parse_head_label(item[0]))
        scores.append(score(item[1], f"score of entry #{i} ({item[0]})"))
    return heads, scores


def _qrhead_string(text: Any) -> list[Head]:
    require(isinstance(text, str), f"QRHead head set must be a string 'L-H,L-H,...', got {type(text).__name__}")
    require(text.strip() != "", "empty head list")
    if text.strip() == "full_heads":
        raise HeadSetError("'full_heads' means every head (QRHead's full-head retriever), not a head set")
    parts = text.split(",")
    for i, p in enumerate(parts):
        require(p.strip() != "", f"empty entry #{i} in head string {brief(text)}")
    return [parse_head_label(p) for p in parts]


def _qrhead_yaml(obj: Any, spec: Any) -> tuple[list[Head], str | None]:
    """A plain string, QRHead's config mapping (attn_head_set: ...), or {model: string}."""
    if isinstance(obj, str):
        return _qrhead_string(obj), None
    require(isinstance(obj, Mapping), f"expected a 'L-H,...' string or a mapping, got {type(obj).__name__}")
    if "attn_head_set" in obj:
        model = obj.get("model_name_or_path") or obj.get("model_base_class")
        return _qrhead_string(obj["attn_head_set"]), optional_str(model, "model_name_or_path")
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
    require(isinstance(obj, list), f"expected a list of [layer, head] pairs, got {type(obj).__name__}")
    require(len(obj) > 0, "empty head list")
    heads = []
    for i, item in enumerate(obj):
        require(
            isinstance(item, (list, str)),
            f"entry #{i} must be [layer, head] or '(layer, head)', got {type(item).__name__} {brief(item)}",
        )
        heads.append(head_pair(item, f"entry #{i}"))
    return heads, model


def _retrieval_head(obj: Any) -> tuple[list[Head], list[float], int | None]:
    """{'L-H': [score per example]} -> heads ranked by mean score (ties keep file order)."""
    require(
        isinstance(obj, Mapping),
        f"Retrieval_Head JSON must be an object {{\"layer-head\": [scores]}}, got {type(obj).__name__}",
    )
    require(len(obj) > 0, "empty head mapping")
    rows = []
    lengths = set()
    for label, vals in obj.items():
        head = parse_head_label(label)
        require(isinstance(vals, list), f"scores of {brief(label)} must be a list of numbers, got {brief(vals)}")
        require(len(vals) > 0, f"scores of {brief(label)} are an empty list")
        nums = [score(v, f"score #{j} of {brief(label)}") for j, v in enumerate(vals)]
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
        if all(is_head_label(k) for k in obj):
            return FMT_RETRIEVAL_HEAD
        values = list(obj.values())
        if all(isinstance(v, str) for v in values):
            return FMT_QRHEAD_YAML  # {model: "L-H,..."}
        if all(isinstance(v, list) for v in values):
            return FMT_DYSCO_YAML  # {model: [[layer, head], ...]}
    if isinstance(obj, list):
        require(len(obj) > 0, "empty head list")
        first = obj[0]
        if isinstance(first, list) and len(first) == 2 and isinstance(first[0], str):
            return FMT_QRHEAD_JSON
        return FMT_DYSCO_YAML
    raise HeadSetError(
        f"unrecognised head file content ({type(obj).__name__}); accepted formats: {', '.join(FORMATS)}"
    )


def _from_parsed(obj: Any, fmt: str, spec: Any, source_name: str | None) -> HeadSet:
    imported_from = {"source_file": source_name} if source_name else {}
    data = f"imported from {source_name}" if source_name else "imported"
    if fmt == FMT_OURS:
        return headset_from_dict(obj)
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
    *,
    fmt: str | None = None,
    top_k: int | None = None,
    allow_other_model: bool = False,
    label: str | None = None,
) -> HeadSet:
    """Read a head set from a file, a parsed object, a 'L-H,...' string or a HeadSet.

    Args:
        path_or_obj: a head file (ours, QRHead JSON or YAML, DySCO YAML, Retrieval_Head JSON),
            its parsed content, a "16-3,20-14" string or a HeadSet.
        spec: the model (ModelSpec, LoadedModel or geometry): indices are checked against it,
            an imported set records its geometry, and a file made for another model is a
            HeadModelMismatchError.
        fmt: one of FORMATS; None sniffs it from the extension (.json, .yaml/.yml), then the content.
        top_k: keep the first k heads of the ranking.
        allow_other_model: accept a file whose recorded model differs but whose geometry matches.
        label: how errors name a 'L-H,...' string (the option it came from); default: heads '...'.

    Returns:
        The HeadSet, in ranking order.
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
            text = read_text(path)
            ext = path.suffix.lower()
            if ext in (".yaml", ".yml") or (ext != ".json" and fmt in (FMT_QRHEAD_YAML, FMT_DYSCO_YAML)):
                obj = parse_yaml_text(text, source)
            elif ext == ".json" or fmt is not None:
                obj = parse_json_text(text, source)
            else:
                raise HeadFileError(f"{path}: unknown extension {brief(ext)}: use .json or .yaml, or pass fmt=")
        elif isinstance(path_or_obj, (str, os.PathLike)) and _looks_like_path(path_or_obj):
            raise HeadFileError(f"head file not found: {path_or_obj}")
        elif isinstance(path_or_obj, str):
            source = label or f"heads {brief(path_or_obj)}"
        hs = naming_source(source, lambda: _from_parsed(check_depth(obj), fmt or _sniff(obj), spec, source_name))
    if spec is not None:
        hs = naming_source(source, lambda: _adopt_geometry(hs, spec, allow_other_model))
    if top_k is not None:
        hs = hs.top(top_k)
    return hs


def _as_existing_path(x: Any) -> Path | None:
    if isinstance(x, os.PathLike) or (isinstance(x, str) and "\n" not in x and len(x) < 4096):
        p = Path(x)
        try:  # anything there, a FIFO or a folder too: `read_text` says what it is instead of "not found"
            return p if p.exists() else None
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
        if allow_other_model and hs.model and geo.name and hs.model != geo.name:
            # accepted once, here: the set now names the model it runs on (later checks pass) and
            # keeps where it came from
            return dataclasses.replace(hs, model=geo.name, extra={**hs.extra, "source_model": hs.model})
        return hs
    extra = dict(hs.extra)
    if hs.model and geo.name and hs.model != geo.name:
        extra.setdefault("source_model", hs.model)
    return dataclasses.replace(
        hs, model=geo.name or hs.model, n_layers=geo.n_layers, n_heads=geo.n_heads,
        n_kv_heads=geo.n_kv_heads, extra=extra,
    )
