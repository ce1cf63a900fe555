"""The forms users write to the decoding API, checked and normalised once: configs and their
keyword options, heads, teacher-forced answers, TransformerLens hooks, and the keywords the
decoding calls still take for one release. Every wrong form is a one-line ConfigError that names
what to pass instead."""

from __future__ import annotations

import difflib
import os
import sys
import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dysco_interp.chat import encode_text
from dysco_interp.checks import brief, check_type, is_int, typed
from dysco_interp.decoding.backends import REGISTRY, check_backend, no_hooks_message
from dysco_interp.decoding.config import KEYWORDS, DecodingConfig
from dysco_interp.decoding.format_forced import Run, check_segments, segment_runs
from dysco_interp.decoding.plan import Read
from dysco_interp.decoding.prompts import outside_vocab
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet, resolve_heads
from dysco_interp.hooks import Hook
from dysco_interp.models import LoadedModel

HOOKS_FORM = "hooks must be a list of (hook name or filter function, fn(tensor, hook)) pairs"


def check_config(config, what: str = "config") -> None:
    check_type(what, config, DecodingConfig, example="e.g. DecodingConfig(method='dysco') or preset('paper')")


def check_configs(configs) -> None:
    """ConfigError unless `configs` maps names to DecodingConfig objects."""
    if not isinstance(configs, Mapping) or not configs:
        raise ConfigError(f"configs must be a non-empty mapping of name -> DecodingConfig, got {typed(configs)}")
    for name, config in configs.items():
        check_config(config, f"config {name!r}")


def as_heads(model: LoadedModel, heads) -> HeadSet | None:
    """The head set from the forms users write: a HeadSet; "shipped", an 'L17H3,L17H4' string or a
    head file; or (layer, head) pairs. Anything else is a ConfigError naming those forms."""
    if heads is None or isinstance(heads, HeadSet):
        return heads
    if isinstance(heads, (str, os.PathLike)):
        return resolve_heads(model, heads)
    pairs = list(heads) if isinstance(heads, (list, tuple)) else None
    if pairs and all(isinstance(h, (list, tuple)) and len(h) == 2 and all(is_int(x) for x in h) for h in pairs):
        spec = model.spec
        return HeadSet([(int(layer), int(head)) for layer, head in pairs], model=spec.name, n_layers=spec.n_layers,
                       n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads)
    raise ConfigError(f"heads must be a HeadSet, (layer, head) pairs, 'shipped', an 'L17H3,L17H4' string or a "
                      f"head file, got {typed(heads)}")


def one_per_prompt(value: Any, n_prompts: int, name: str, each: str, plural: str) -> Sequence:
    """`value` if it is a list of `n_prompts` items, else a ConfigError naming `name` (`each` is
    what one item is, `plural` what the items are called in the count)."""
    if isinstance(value, (str, Mapping)) or not isinstance(value, Sequence):
        raise ConfigError(f"{name} must be a list with one {each} per prompt, got {typed(value)}")
    if len(value) != n_prompts:
        raise ConfigError(f"{len(value)} {plural} for {n_prompts} prompts")
    return value


def forced_ids(model: LoadedModel, forced: Sequence[str | Sequence[int]], n_prompts: int) -> list[list[int]]:
    """Each prompt's gold continuation as token ids (text is encoded on its own, after the prompt)."""
    one_per_prompt(forced, n_prompts, "forced", "gold answer", "forced answers")
    out = []
    for i, gold in enumerate(forced):
        ids = encode_text(model.tokenizer, gold)[0] if isinstance(gold, str) else gold
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or not all(is_int(t) for t in ids):
            raise ConfigError(f"forced answer #{i} must be text or a list of token ids, got {typed(gold)}")
        if not ids:
            raise ConfigError(f"forced answer #{i} is empty: teacher forcing needs at least one gold token")
        bad = outside_vocab(model, ids)
        if bad:
            raise ConfigError(f"forced answer #{i} has token ids outside the vocabulary: {brief(bad)}")
        out.append([int(t) for t in ids])
    return out


def format_runs(model: LoadedModel, segments, n_prompts: int) -> list[list[Run]]:
    """Each prompt's answer segments (`format_forced.check_segments`) as token runs: the joined
    text is encoded on its own after the prompt, as a teacher-forced answer is."""
    one_per_prompt(segments, n_prompts, "format_forced", "answer's segments", "segmented answers")
    out = []
    for i, answer in enumerate(segments):
        answer = check_segments(answer, f"format_forced #{i}")
        ids, offsets = encode_text(model.tokenizer, "".join(t for t, _ in answer))
        out.append(segment_runs(ids, offsets, answer))
    return out


def with_fields(config: DecodingConfig, fields: Mapping) -> DecodingConfig:
    """`config` with some of its fields replaced; ConfigError naming an unknown one."""
    names = list(KEYWORDS)
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}; the decoding options are {', '.join(names)}")
    return config.replace(**fields) if fields else config


def hook_pairs(hooks) -> list[Hook]:
    """User hooks as TransformerLens takes them: `(name, fn)` with `name` a hook point's name or a
    filter `name -> bool`; the names are checked against a model by `check_hooks`."""
    if hooks is None:
        return []
    if isinstance(hooks, (str, Mapping)) or not isinstance(hooks, Sequence):
        raise ConfigError(f"{HOOKS_FORM}, got {typed(hooks)}")
    if len(hooks) == 2 and (isinstance(hooks[0], str) or callable(hooks[0])) and callable(hooks[1]):
        raise ConfigError(f"{HOOKS_FORM}: wrap one pair in a list, hooks=[(name, fn)]")
    out: list[Hook] = []
    for i, hook in enumerate(hooks):
        if not (isinstance(hook, (list, tuple)) and len(hook) == 2):
            raise ConfigError(f"{HOOKS_FORM}; hook #{i} is {typed(hook)}")
        name, fn = hook
        if not callable(fn):
            raise ConfigError(f"hook #{i}: its function must be callable as fn(tensor, hook), got {typed(fn)}")
        if not (isinstance(name, str) or callable(name)):
            raise ConfigError(f"hook #{i}: the name must be a hook point name or a filter function, got {typed(name)}")
        out.append((name, fn))
    return out


def check_hooks(model: LoadedModel, hooks, backend: str | None = None) -> list[Hook]:
    """`hook_pairs(hooks)`, each name a hook point of the bridge; with `backend`, one that runs hooks."""
    out = hook_pairs(hooks)
    names = model.bridge.hook_dict
    for i, (name, _) in enumerate(out):
        if isinstance(name, str) and name not in names:
            close = difflib.get_close_matches(name, list(names), n=2)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else \
                " (model.bridge.hook_dict lists them)"
            raise ConfigError(f"hook #{i}: {name!r} is no hook point of {model.spec.name}{hint}")
    # checked here too, before any prompt is encoded; the backend's own check is the same rule
    if out and backend is not None and not REGISTRY[check_backend(backend)].runs_hooks:
        raise ConfigError(no_hooks_message(backend))
    return out


# The keywords the decoding calls took before hooks and read-outs were scoped by `observe` and a
# backend's options were its `BackendSpec`'s, and what replaces each: they work for one release.
RETIRED = {
    "hooks": "decode inside `with observe(model, hooks=...)`",
    "read_out": "pass read= (the same plan.Read)",
    "on_read": "decode inside `with observe(model, on_read=...)`",
    "graphs": "pass backend=BackendSpec(name, graphs=...)",
    "decode_attention": "pass backend=BackendSpec('static', decode_attention=...)",
}
# the modules a decoding call passes through before it reads its retired keywords
API_MODULES = frozenset({"dysco_interp.decoding.loop", __name__})


def retired_keywords(given: Mapping[str, Any], allowed: Collection[str] = tuple(RETIRED)) -> dict[str, Any]:
    """`given` (a decoding call's extra keywords) if each is a retired keyword, each announced in
    one DeprecationWarning that names the function called and points at the line that called
    it; any other keyword is the TypeError Python gives for an unknown one."""
    # the first frame outside the decoding API is the user's call (Python 3.12's skip_file_prefixes, by hand)
    frame, level, called = sys._getframe(1), 2, "the decoding call"
    while frame.f_back is not None and frame.f_globals.get("__name__") in API_MODULES:
        called, frame, level = frame.f_code.co_name, frame.f_back, level + 1
    for name in given:
        if name not in allowed:
            raise TypeError(f"{called}() got an unexpected keyword argument {name!r}")
        warnings.warn(f"{called}({name}=) is deprecated and goes in the next release: {RETIRED[name]}",
                      DeprecationWarning, stacklevel=level)
    return dict(given)


def the_read(read: Read | None, retired: Mapping[str, Any]) -> Read | None:
    """A call's read, given as `read=` or by its retired name `read_out=` (not both)."""
    if "read_out" not in retired:
        return read
    if read is not None:
        raise ConfigError("read_out= is read='s old name: give read= alone")
    return retired["read_out"]
