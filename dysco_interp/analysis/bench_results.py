"""Decode speed and peak memory of vanilla vs DySCO, read from benchmark JSON documents
and from evaluation records (pure: parsed JSON in, rows out).

Benchmark files differ in layout, so the reader accepts, for each method m in
("vanilla", "dysco"):
- flat row fields: `m_tok_per_s`, `m_decode_tok_per_s`, `m_tokens_per_s`, or
  `m_step_ms` (converted to tokens/s), and `m_peak_<memory>_<unit>`;
- a nested dict `row[m]` or `row["methods"][m]` with the same fields unprefixed;
- one row per method (`row["method"] == m`), joined on the other row fields.
Memory fields are any key with "peak" and "mem" in it; the unit comes from its suffix
(_bytes, _kib, _mib/_mb, _gib/_gb). What a document lacks is reported, not guessed.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dysco_interp.decoding.choices import backends_with

METHODS = ("vanilla", "dysco")
_TOK_KEYS = ("decode_tok_per_s", "tok_per_s", "tokens_per_s", "decode_tokens_per_s")
_STEP_KEYS = ("step_ms", "decode_step_ms")
_CONTEXT_KEYS = ("context", "n_context", "context_tokens", "context_length", "n_prompt", "prompt_tokens",
                 "input_tokens", "length")
_BATCH_KEYS = ("batch", "batch_size")
_META_KEYS = ("device", "gpu", "n_gpus", "machine_name", "backend", "model", "dtype", "attention")
_UNITS_GIB = {"bytes": 1 / 2**30, "b": 1 / 2**30, "kib": 1 / 2**20, "kb": 1 / 2**20, "mib": 1 / 1024,
              "mb": 1 / 1024, "gib": 1.0, "gb": 1.0}


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _tok_per_s(fields: Mapping, prefix: str = "") -> float | None:
    for k in _TOK_KEYS:
        v = _number(fields.get(prefix + k))
        if v is not None:
            return v
    for k in _STEP_KEYS:
        v = _number(fields.get(prefix + k))
        if v:
            return 1000.0 / v
    return None


def _peak_gib(fields: Mapping, prefix: str = "") -> float | None:
    for key, value in fields.items():
        k = key.lower()
        if not k.startswith(prefix) or "peak" not in k or "mem" not in k or _number(value) is None:
            continue
        unit = k.rsplit("_", 1)[-1]
        if unit in _UNITS_GIB:
            return float(value) * _UNITS_GIB[unit]
    return None


def _first(fields: Mapping, keys: Iterable[str]):
    return next((fields[k] for k in keys if fields.get(k) is not None), None)


def _rows_of(doc: Any) -> list[Mapping]:
    if isinstance(doc, list):
        return [r for r in doc if isinstance(r, Mapping)]
    if isinstance(doc, Mapping):
        for key in ("rows", "results", "runs"):
            if isinstance(doc.get(key), list):
                return [r for r in doc[key] if isinstance(r, Mapping)]
        return [doc]
    return []


def _method_fields(row: Mapping, method: str) -> tuple[float | None, float | None]:
    for nested in (row.get(method), (row.get("methods") or {}).get(method) if isinstance(row.get("methods"), Mapping)
                   else None):
        if isinstance(nested, Mapping):
            return _tok_per_s(nested), _peak_gib(nested)
    return _tok_per_s(row, method + "_"), _peak_gib(row, method + "_")


def _join_per_method_rows(rows: Iterable[Mapping]) -> list[dict]:
    """Rows that each hold one method (row["method"]) become one row per configuration."""
    joined: dict[tuple, dict] = {}
    for r in rows:
        method = str(r.get("method", "")).lower()
        if method not in METHODS:
            continue
        key = tuple(sorted((k, str(v)) for k, v in r.items()
                           if k in _CONTEXT_KEYS + _BATCH_KEYS + _META_KEYS))
        joined.setdefault(key, {k: r[k] for k in r if k in _CONTEXT_KEYS + _BATCH_KEYS + _META_KEYS})
        joined[key][method] = r
    return list(joined.values())


# looked up with whatever a benchmark recorded as its dtype
_SHORT_DTYPES: dict[object, str] = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def short_device(name) -> str | None:
    """"NVIDIA H100 80GB HBM3" -> "H100"; other names as they are."""
    found = re.search(r"\b([A-Z]\d{2,4})\b", str(name)) if name else None
    return found.group(1) if found else name


def device_label(row: Mapping) -> str | None:
    """Where a row ran, short: "H100", or "2× H100" for a model split over two GPUs."""
    device = short_device(row.get("device") or row.get("gpu"))
    n_gpus = row.get("n_gpus")
    return f"{n_gpus}× {device}" if device and isinstance(n_gpus, int) and n_gpus > 1 else device


def _short_context(n) -> str | None:
    if not n:
        return None
    return f"ctx {n // 1024}K" if isinstance(n, int) and n % 1024 == 0 else f"ctx {n}"


def decode_rows(doc: Any, source: str) -> tuple[list[dict], list[str]]:
    """Rows {source, label, context, batch, <method>_tok_per_s, <method>_peak_gib, slowdown,
    memory_ratio} from one benchmark document, and notes on what it lacks."""
    meta = {k: doc.get(k) for k in _META_KEYS if isinstance(doc, Mapping) and isinstance(doc.get(k), (str, int))}
    torch_version = str(((doc.get("versions") or {}) if isinstance(doc, Mapping) else {}).get("torch", ""))
    if "device" not in meta and "gpu" not in meta and torch_version.endswith("+cpu"):
        meta["device"] = "CPU"  # a CPU-only torch build can only have run on the CPU
    machine = doc.get("machine") if isinstance(doc, Mapping) else None
    if "device" not in meta and isinstance(machine, Mapping) and isinstance(machine.get("device"), str):
        meta["device"] = machine["device"]
    variant = ((doc.get("config") or {}) if isinstance(doc, Mapping) else {}).get("method")
    variant = variant if isinstance(variant, str) else None  # a benchmark may time a DySCO variant
    # the decoding attention of a backend that has a choice of it; files from before the fused one
    # timed the float32 path
    attention = doc.get("decode_attention") if isinstance(doc, Mapping) else None
    if attention is None and meta.get("backend") in backends_with("decode_attention"):
        attention = "float32"
    yarn = doc.get("yarn_factor") if isinstance(doc, Mapping) else None
    rows: Sequence[Mapping] = _rows_of(doc)
    if any("method" in r for r in rows):
        rows = _join_per_method_rows(rows)
    out, notes = [], []
    for r in rows:
        values = {m: _method_fields(r, m) for m in METHODS}
        if all(v[0] is None for v in values.values()):
            continue
        context, batch = _first(r, _CONTEXT_KEYS), _first(r, _BATCH_KEYS)
        info = {**meta, **{k: r[k] for k in _META_KEYS if isinstance(r.get(k), (str, int))}}
        label = ", ".join(str(x) for x in (device_label(info), info.get("backend"),
                                            info.get("model"), _SHORT_DTYPES.get(info.get("dtype"), info.get("dtype")),
                                            _short_context(context), f"batch {batch}" if batch and batch != 1 else None)
                          if x)
        if attention:
            label = f"{label}, {attention} attention"
        if isinstance(yarn, (int, float)):
            label = f"{label}, YaRN {yarn:g}"
        if variant not in (None, "dysco"):
            label = f"{label}, {variant}"
        row = {"source": source, "label": label or source, "variant": variant, "context": context, "batch": batch,
               "attention": attention, "yarn": yarn, **info}
        for m, (tok, mem) in values.items():
            row[f"{m}_tok_per_s"] = tok
            row[f"{m}_peak_gib"] = mem
        v, d = row["vanilla_tok_per_s"], row["dysco_tok_per_s"]
        row["slowdown"] = v / d if v and d else None
        vm, dm = row["vanilla_peak_gib"], row["dysco_peak_gib"]
        row["memory_ratio"] = dm / vm if vm and dm else None
        out.append(row)
    if not out:
        notes.append(f"{source}: no decode tokens/s for vanilla or dysco; skipped")
        return out, notes
    for field, what in (("tok_per_s", "decode tokens/s"), ("peak_gib", "peak memory")):
        for m in METHODS:
            if any(r[f"{m}_{field}"] is None for r in out):
                notes.append(f"{source}: no {what} for {m}" + ("" if all(r[f"{m}_{field}"] is None for r in out)
                                                              else " in some rows"))
    return out, notes


def record_speed_rows(records: Iterable[Mapping], source: str) -> list[dict]:
    """Median decode tokens/s of vanilla and default-parameter DySCO runs per (model, task,
    length, batch size), from the timings evaluation records carry (no memory there). Rows
    decoded together share one decode time, so a batch's speed is all its rows' tokens over it."""
    from dysco_interp.analysis.method_key import method_key

    batches: dict[tuple, float] = defaultdict(float)
    for r in records:
        key = method_key(r)
        t = r.get("timings") or {}
        decode_s, n_new = _number(t.get("decode_s")), _number(t.get("n_new"))
        if not decode_s or n_new is None or key.method not in METHODS or not key.is_default:
            continue
        batch = int(t.get("batch_size") or 1)
        # the first token comes from the warm-up's logits; each later one is a decode step
        batches[(str(r["model"]), str(r["task"]), int(r.get("length") or 0), batch, key.method, decode_s,
                 None if batch > 1 else id(r))] += max(n_new - 1, 0)
    speeds: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (model, task, length, batch, method, decode_s, _), steps in batches.items():
        speeds[(model, task, length, batch)][method].append(steps / decode_s)
    rows = []
    for (model, task, length, batch), by_method in sorted(speeds.items()):
        if not all(by_method.get(m) for m in METHODS):
            continue
        v, d = (statistics.median(by_method[m]) for m in METHODS)
        what = "eval records" if batch == 1 else f"eval records, batch of {batch}"
        rows.append({"source": source, "label": f"{model}, {task} {length} ({what})", "model": model, "task": task,
                     "context": length, "batch": batch, "vanilla_tok_per_s": v, "dysco_tok_per_s": d,
                     "vanilla_peak_gib": None, "dysco_peak_gib": None, "slowdown": v / d, "memory_ratio": None,
                     "n_runs": {m: len(by_method[m]) for m in METHODS}})
    return rows
