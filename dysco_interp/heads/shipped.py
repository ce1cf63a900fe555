"""Head sets that ship with the package, and the one reader of a command's heads option.

Both kinds are package data under `heads/data/`: `shipped/<alias>.json`, the QRHeads
detected for a packaged model, in our head-file format (written by
`analyses/ship_heads.py`); and `paper_heads.json`, the head lists the DySCO release
uses, as HeadSet fields keyed by model id (0-indexed (layer, query_head), ranking
order; Qwen3-8B's is the same list as QRHead's Qwen3-8B_qr_head_NQ config).
`resolve_heads` turns "shipped" or a file into a head set for every command and script.
"""

from __future__ import annotations

import os
import re
from importlib import resources
from typing import Any

from dysco_interp.checks import brief
from dysco_interp.errors import ConfigError
from dysco_interp.heads.errors import HeadFileError
from dysco_interp.heads.formats import load_heads
from dysco_interp.heads.headset import HeadSet, normalize_model_id
from dysco_interp.heads.safe_parse import parse_json_text

SHIPPED = "shipped"  # the heads option's value that means "the shipped file of the model's alias"

_SHIPPED_DIR = ("data", "shipped")
_PAPER_FILE = ("data", "paper_heads.json")


def _data(*parts: str):
    return resources.files("dysco_interp.heads").joinpath(*parts)


def available_shipped_heads() -> list[str]:
    """Aliases with a packaged head file (dysco_interp/heads/data/shipped/<alias>.json)."""
    try:
        folder = _data(*_SHIPPED_DIR)
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
    source = shipped_path(alias)
    obj = parse_json_text(_data(*_SHIPPED_DIR, f"{alias}.json").read_text(encoding="utf-8"), source)
    return HeadSet.from_dict(obj, spec=spec, allow_other_model=allow_other_model, source=source)


def paper_heads(model: str = "qwen3-8b") -> HeadSet:
    """The head set the DySCO release ships for `model` (only Qwen3-8B is recorded)."""
    source = "dysco_interp/heads/" + "/".join(_PAPER_FILE)
    known = parse_json_text(_data(*_PAPER_FILE).read_text(encoding="utf-8"), source)
    key = normalize_model_id(model) if isinstance(model, str) else None
    if key not in known:
        raise ConfigError(f"no DySCO paper head list for {brief(model)}; known: {', '.join(sorted(known))}")
    return HeadSet(**known[key])


def resolve_heads(model: Any, source: str | os.PathLike | None = None, allow_other_model: bool = False,
                  label: str | None = None) -> HeadSet:
    """The head set a heads option names: the model's shipped file, or a head file.

    Args:
        model: a loaded model or its ModelSpec (the set is checked against it, and its name
            is the shipped file's alias; a loaded model's weights also find the alias whose
            weights it holds, `shipped_alias`), or a model alias (the set is only read: a check
            before the model loads).
        source: "shipped" or None for the shipped file; anything else is a head file (or a
            'L-H,...' string) for `load_heads`.
        allow_other_model: accept a head file made for another model of the same geometry.
        label: how errors name a 'L-H,...' string (e.g. the option it came from).

    Returns:
        The HeadSet; a missing or malformed file, or one made for another model, is a
        HeadSetError (HeadFileError, HeadModelMismatchError), a bad alias a ConfigError.
    """
    return resolve_heads_origin(model, source, allow_other_model, label)[0]


def resolve_heads_origin(model: Any, source: str | os.PathLike | None = None, allow_other_model: bool = False,
                         label: str | None = None) -> tuple[HeadSet, str]:
    """`resolve_heads`, and where the set came from in words: "shipped for ALIAS (FILE)",
    "from FILE" or "from LABEL" (a 'L-H,...' string)."""
    if isinstance(model, str):
        alias, target = model, None
    else:
        target = model  # a LoadedModel is checked by its weights too (`HeadSet.validate_for`)
        alias = getattr(model, "spec", model).name
    if source is None or source == SHIPPED:
        alias = shipped_alias(alias, target)
        return shipped_heads(alias, spec=target), f"shipped for {alias} ({shipped_path(alias)})"
    heads = load_heads(source, spec=target, allow_other_model=allow_other_model, label=label)
    where = str(source) if os.path.exists(source) else (label or str(source))
    return heads, f"from {where}"


def describe_heads(heads: HeadSet, origin: str) -> str:
    """One line naming a head set and its origin, e.g. 'heads: 16 qrscore heads shipped for
    smollm2-135m (dysco_interp/heads/data/shipped/smollm2-135m.json): L3H1, L5H0, ...'."""
    shown = ", ".join(f"L{layer}H{head}" for layer, head in heads.heads[:6])
    more = f", ... ({len(heads) - 6} more)" if len(heads) > 6 else ""
    return f"heads: {len(heads)} {heads.method} heads {origin}: {shown}{more}"


def shipped_path(alias: str) -> str:
    """The shipped head file of `alias`, as the package names it (no machine path)."""
    return "dysco_interp/heads/" + "/".join((*_SHIPPED_DIR, f"{alias}.json"))


def shipped_alias(name: str, model: Any = None) -> str:
    """The alias whose shipped head file fits a model: its own name, or, for a model loaded under
    another name (a folder), the alias whose weights it holds; else the name (whose missing
    file `shipped_heads` reports)."""
    available = available_shipped_heads()
    if name in available or model is None or not hasattr(model, "weights_fingerprint"):
        return name
    from dysco_interp.models.recognise import same_weights

    spec = model.spec
    for alias in available:
        source = shipped_path(alias)
        recorded = parse_json_text(_data(*_SHIPPED_DIR, f"{alias}.json").read_text(encoding="utf-8"), source)
        # only a file of the same geometry is worth reading the alias's weights for
        if (recorded.get("n_layers"), recorded.get("n_heads")) == (spec.n_layers, spec.n_heads) \
                and same_weights(alias, model):
            return alias
    return name
