"""DySCO's overhead: an analytic FLOPs estimate (the paper's Qwen3-8B setting and ours) and
measured decode tokens/s and peak memory, vanilla vs DySCO on the same backend.

FLOPs come from `flops` (see its docstring for what is counted). Measurements come from
benchmark JSON files (bench_decode.py output, or GPU benchmarks with per-method tokens/s and
peak memory; `bench_results` reads the layouts) and from the decode timings evaluation
records carry. Missing inputs are reported in the outputs, not guessed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dysco_interp.analysis import flops
from dysco_interp.analysis.bench_results import decode_rows, device_label, record_speed_rows
from dysco_interp.analysis.flops import ModelShape, decode_token_flops, dysco_extra_token, overhead
from dysco_interp.analysis.records import display_path, pool_files
from dysco_interp.analysis.report import with_footer
from dysco_interp.errors import ConfigError, DataError
from dysco_interp.heads import resolve_heads
from dysco_interp.jsonl import MAX_LINE, open_input
from dysco_interp.models import packaged as packaged_models
from dysco_interp.stores.archives import expand
from dysco_interp.viz.panels import Panel, Series
from dysco_interp.viz.tables import table_markdown

# The paper's setting (Qwen3-8B config; deepest of its 16 shipped QRHeads is layer 24).
PAPER: dict[str, Any] = {
    "name": "Qwen3-8B",
    "shape": {"n_layers": 36, "d_model": 4096, "n_heads": 32, "n_kv_heads": 8, "d_head": 128, "d_mlp": 12288,
              "vocab": 151936},
    "deepest_layer": 24, "n_qr_heads": 16, "inputs": [100_000], "outputs": [4096, 8192]}
# The paper's own measurement (eager attention, H100, Qwen3-8B, 100K in, 4K out).
PAPER_MEASURED = {"source": "paper (reported)", "label": "paper: Qwen3-8B, H100, eager, 100K", "model": "Qwen3-8B",
                  "context": 100_000, "batch": 1, "vanilla_tok_per_s": 6.1, "dysco_tok_per_s": 3.6,
                  "vanilla_peak_gib": None, "dysco_peak_gib": None, "slowdown": 6.1 / 3.6, "memory_ratio": None}
# Shapes read from the packaged models' HF config.json, for machines where the model is
# not converted (the analytic estimate needs no weights).
RECORDED_SHAPES = {
    "qwen2.5-coder-0.5b": {"n_layers": 24, "d_model": 896, "n_heads": 14, "n_kv_heads": 2, "d_head": 64,
                           "d_mlp": 4864, "vocab": 151936},
    "qwen2.5-coder-1.5b": {"n_layers": 28, "d_model": 1536, "n_heads": 12, "n_kv_heads": 2, "d_head": 128,
                           "d_mlp": 8960, "vocab": 151936},
    "smollm2-135m": {"n_layers": 30, "d_model": 576, "n_heads": 9, "n_kv_heads": 3, "d_head": 64, "d_mlp": 1536,
                     "vocab": 49152},
}


def model_setting(alias: str) -> dict:
    """Shape (the one recorded from the model's HF config.json, else the converted model's
    config.json) and shipped heads.

    The recorded shape wins so that the outputs are the same on every machine, whether or not
    the model is converted there; where both exist they must agree.
    """
    model = packaged_models.REGISTRY.get(alias)
    config = packaged_models.converted_folder(model) / "config.json" if model else None
    converted = None
    if model is not None and config is not None and packaged_models.is_converted(model) and config.is_file():
        converted = ModelShape.from_hf_config(json.loads(config.read_text()), alias)
    if alias in RECORDED_SHAPES:
        shape = ModelShape(**RECORDED_SHAPES[alias], name=alias)
        if converted is not None and converted.as_dict() != shape.as_dict():
            raise ConfigError(f"{alias}: the converted model's config.json gives {converted.as_dict()}, "
                              f"RECORDED_SHAPES says {shape.as_dict()}; update RECORDED_SHAPES")
        source = "its HF config.json"
    elif converted is not None:
        shape, source = converted, "its HF config.json"
    else:
        raise ConfigError(f"no shape for model {alias!r}: convert it (dysco-interp install-model) or add it to "
                          "RECORDED_SHAPES")
    heads = resolve_heads(alias)  # the alias's shipped heads, read without a model
    if heads.n_layers is not None and (heads.n_layers, heads.n_heads) != (shape.n_layers, shape.n_heads):
        raise ConfigError(f"{alias}: head file is for {heads.n_layers}x{heads.n_heads} heads, the config has "
                          f"{shape.n_layers}x{shape.n_heads}")
    return {"name": alias, "shape": shape, "shape_source": source, "deepest_layer": heads.max_layer,
            "n_qr_heads": len(heads)}


def flops_rows(settings: list[dict]) -> list[dict]:
    rows = []
    for s in settings:
        for n_in in s["inputs"]:
            for n_out in s["outputs"]:
                o = overhead(s["shape"], n_in, n_out, s["deepest_layer"], s["n_qr_heads"])
                rows.append({"setting": s["role"], "model": s["name"], "n_layers": s["shape"].n_layers, **o})
    return rows


def curves(settings: list[dict]):
    """Per-token FLOPs ratio vs context, and the extra share of the total vs input length."""
    ratio, share = [], []
    for s in settings:
        top = 131072 if s["role"] == "paper" else 32768
        xs = [2**k for k in range(9, 18) if 2**k <= top]
        ys = [1 + dysco_extra_token(s["shape"], n, s["deepest_layer"], s["n_qr_heads"]).total
              / decode_token_flops(s["shape"], n) for n in xs]
        name = f"{s['name']} (layers 0-{s['deepest_layer']} of {s['shape'].n_layers})"
        ratio.append(Series(name, ys, x=xs))
        for n_out in s["outputs"]:
            ins = [n for n in xs if n >= 1024]
            share.append(Series(f"{s['name']}, {n_out} out",
                                [100 * overhead(s["shape"], n, n_out, s["deepest_layer"], s["n_qr_heads"])
                                 ["extra_share_of_total"] for n in ins], x=ins))
    return ratio, share


def read_bench(path: Path) -> bytes:
    """A benchmark file's bytes: a DataError for no regular file (a FIFO never blocks the read) or
    one larger than any benchmark (a line's cap, `jsonl.MAX_LINE`: benchmark files are kilobytes)."""
    with open_input(path, "no such file: {path}", "{path} is a folder, not a benchmark JSON file",
                    "cannot read {path}: {why}",
                    "{path} is {kind}, not a regular file; name a benchmark JSON file") as f:
        data = f.read(MAX_LINE + 1)
    if len(data) > MAX_LINE:
        raise DataError(f"{path} is larger than {MAX_LINE >> 20} MiB, far more than a benchmark file holds; "
                        "not a benchmark JSON file")
    return data


def measured(bench: list[str], stores: list[str], root: Path) -> tuple[list[dict], list[str], list[str]]:
    """Measured speed (and memory) rows from benchmark JSONs and evaluation stores (glob
    patterns; paths shown relative to `root`), with notes on what is missing, and the sources."""
    rows, notes, sources = [], [], []
    files, unmatched = expand(bench or [])
    notes += [f"no benchmark file matches {p}" for p in unmatched]
    for f in files:
        name = display_path(f, root)
        try:
            doc = json.loads(read_bench(f))
        except json.JSONDecodeError:
            notes.append(f"{name}: not valid JSON; skipped")
            continue
        r, n = decode_rows(doc, name)
        rows += r
        notes += n
        sources.append(name)
    files, unmatched = expand(stores or [])
    notes += [f"no evaluation store matches {p}" for p in unmatched]
    if files:
        records = pool_files(files).records
        speed = record_speed_rows(records, "evaluation stores")
        rows += speed
        sources += [display_path(f, root) for f in files]
        if speed:
            notes.append("'eval records' rows: median decode tokens/s of `dysco-interp evaluate` runs at the default "
                         "DySCO parameters; rows decoded in one batch count together (all their tokens over the "
                         "batch's decode time); evaluation records do not name the device (see figures/README.md)")
    if not any(r.get("vanilla_peak_gib") or r.get("dysco_peak_gib") for r in rows):
        notes.append("no peak-memory measurements in the inputs (evaluation records carry none; GPU benchmark "
                     "JSONs with per-method peak memory fill this in)")
    return rows, notes, sources


def flops_ratio_for(row: dict, settings: list[dict]) -> float | None:
    if row.get("variant") not in (None, "dysco"):
        return None  # the estimate is exact DySCO's (partial pass + full pass)
    # a random-weight benchmark of a real shape ("qwen3-8b-random") counts as that model
    name = str(row.get("model") or "").removesuffix("-random").lower()
    s = next((s for s in settings if s["name"].lower() == name), None)
    n = row.get("context")
    if s is None or not isinstance(n, int) or n < 1:
        return None
    return 1 + dysco_extra_token(s["shape"], n, s["deepest_layer"], s["n_qr_heads"]).total / decode_token_flops(
        s["shape"], n)


def render(result: dict) -> str:
    def t(x):
        return f"{x / 1e12:.3g}"

    def num(x, fmt=".2f"):
        return "-" if x is None else format(x, fmt)

    body = [[r["setting"], r["model"], f"{r['partial_layers']}/{r['n_layers']}", r["n_prompt"], r["n_new"],
             t(r["prefill_flops"]), t(r["decode_flops"]), t(r["dysco_extra_flops"]["total"]),
             f"{r['extra_per_token'] / 1e9:.3g}", f"{r['token_ratio_first']:.3f}-{r['token_ratio_last']:.3f}",
             f"{100 * r['extra_share_of_total']:.2f}%"] for r in result["flops"]]
    parts = ["# DySCO overhead: analytic FLOPs and measured speed and memory", "",
             "## FLOPs estimate (forward pass, 2 FLOPs per multiply-add)", "", result["flops_convention"], "",
             table_markdown(["setting", "model", "partial layers", "input", "output", "prefill TFLOPs",
                             "decode TFLOPs", "DySCO extra TFLOPs", "extra GFLOPs/token",
                             "DySCO/vanilla per token", "extra share of prefill+decode"], body), ""]
    for m in result["models"]:
        s = m["shape"]
        parts.append(f"- {m['name']}: {s['n_layers']} layers, d_model {s['d_model']}, {s['n_heads']} query heads "
                     f"({s['n_kv_heads']} KV) of {s['d_head']}, d_mlp {s['d_mlp']}, vocab {s['vocab']}; "
                     f"{m['n_qr_heads']} QRHeads, deepest in layer {m['deepest_layer']}; "
                     f"shape from {m['shape_source']}")
    meas = [[r["label"], r["source"], num(r["vanilla_tok_per_s"]), num(r["dysco_tok_per_s"]),
             num(r["slowdown"], ".3f"), num(r.get("flops_ratio"), ".3f"), num(r["vanilla_peak_gib"], ".3f"),
             num(r["dysco_peak_gib"], ".3f"), num(r["memory_ratio"], ".3f")] for r in result["measured"]]
    parts += ["", "## Measured decode speed and peak memory (vanilla vs DySCO, same backend)", "",
              table_markdown(["configuration", "source", "vanilla tok/s", "DySCO tok/s", "slowdown",
                              "FLOPs ratio", "vanilla peak GiB", "DySCO peak GiB", "memory ratio"], meas)]
    return with_footer(parts, result)


def overhead_settings(models: list[str], inputs: list[int], outputs: list[int]) -> list[dict]:
    """The paper's setting, then ours: one per model alias, at every input and output length."""
    paper = dict(PAPER, role="paper", shape=ModelShape(**PAPER["shape"], name=PAPER["name"]),
                 shape_source="the Qwen3-8B config (paper setting)")
    return [paper] + [dict(model_setting(a), role="ours", inputs=inputs, outputs=outputs) for a in models]


def overhead_result(settings: list[dict], measured_rows: list[dict], notes: list[str], sources: list[str],
                    command: str) -> dict:
    """The JSON document: FLOPs rows, the measurements (the paper's first) with their FLOPs ratio."""
    meas = [dict(PAPER_MEASURED)] + measured_rows
    for r in meas:
        r["flops_ratio"] = flops_ratio_for(r, settings)
    return {
        "figure": "overhead",
        "command": command,
        "flops_convention": " ".join(flops.__doc__.split("\n\n")[1].split()),
        "models": [{"name": s["name"], "role": s["role"], "shape": s["shape"].as_dict(),
                    "shape_source": s["shape_source"], "deepest_layer": s["deepest_layer"],
                    "n_qr_heads": s["n_qr_heads"]} for s in settings],
        "flops": flops_rows(settings),
        "measured": meas,
        "measurement_sources": sources,
        "notes": notes,
    }


def is_batched(row: dict) -> bool:
    return isinstance(row.get("batch"), int) and row["batch"] > 1


def short_label(row: dict) -> str:
    """A measured row as one bar label: model, where and how it ran, context (and batch)."""
    if row.get("source") == PAPER_MEASURED["source"]:
        return "paper: Qwen3-8B · H100 eager · 100K"
    model = str(row.get("model") or "?")
    model = model.removesuffix("-random") + " shape" if model.endswith("-random") else model
    n, batch = row.get("context"), row.get("batch")
    size = f"{n // 1024}K" if isinstance(n, int) and n % 1024 == 0 and n else str(n or "?")
    if is_batched(row):
        size += f" × {batch}"
    if row.get("yarn"):
        size += f" YaRN {row['yarn']:g}"
    if row.get("source") == "evaluation stores":
        return f"{model} · eval run ({str(row.get('task') or 'task').replace('_', ' ')}) · {size}"
    where = " ".join(str(x) for x in (device_label(row), row.get("backend")) if x)
    if row.get("attention") == "float32":  # the static backend's reference attention, before fused decoding
        where += " (float32 attention)"
    variant = row.get("variant")
    label = " · ".join(x for x in (model, where, size) if x)
    return f"{label} · {variant}" if variant not in (None, "dysco") else label


def speed_panels(rows: list[dict], which: str, per_row: str) -> list[Panel]:
    """Decode speed (log scale) and slowdown of one group of rows, one bar row per configuration,
    side by side: the slowdown panel reuses the speed panel's row labels."""
    labels = [short_label(r) for r in rows]
    tok = [Series(m, [r[f"{key}_tok_per_s"] for r in rows], x=labels)
           for m, key in (("vanilla", "vanilla"), ("DySCO", "dysco"))] if rows else []
    slow = [Series("measured slowdown", [r["slowdown"] for r in rows], x=labels),
            Series("FLOPs ratio (estimate)", [r["flops_ratio"] for r in rows], x=labels)] if rows else []
    return [Panel(f"Decode speed, {which}", "", tok, xlabel=f"tokens/s, log scale{per_row}", kind="bar",
                  horizontal=True, log_y=True, note=f"no {which} measurements"),
            Panel(f"Slowdown, {which}", "", slow, xlabel="vanilla tok/s ÷ DySCO tok/s", kind="bar",
                  horizontal=True, ref=1.0, ref_label="no slowdown (1×)", note=f"no {which} measurements")]


def panels(settings: list[dict], meas: list[dict]) -> list[Panel]:
    """The figure: analytic ratio and share, then measured speed and slowdown, single-stream
    (batch 1) and batched in separate panels, and peak memory."""
    ratio, share = curves(settings)
    measured_rows = [r for r in meas if r["slowdown"]]
    single = [r for r in measured_rows if not is_batched(r)]
    batched = [r for r in measured_rows if is_batched(r)]
    mem_rows = [r for r in meas if r["vanilla_peak_gib"] or r["dysco_peak_gib"]]
    mem_labels = [short_label(r) for r in mem_rows]
    mem = [Series(m, [r[f"{key}_peak_gib"] for r in mem_rows], x=mem_labels)
           for m, key in (("vanilla", "vanilla"), ("DySCO", "dysco"))] if mem_rows else []
    return [
        Panel("Analytic: FLOPs per decode token\nDySCO ÷ vanilla", "ratio", ratio, xlabel="context (tokens)",
              log_x=True),
        Panel("Analytic: DySCO extra FLOPs\n% of prefill + decode", "% of vanilla FLOPs", share, xlabel="input tokens",
              log_x=True),
        *speed_panels(single, "single stream (batch 1)", ""),
        *speed_panels(batched, "batched", ", all rows of the batch"),
        Panel("Peak memory", "", mem, xlabel="GiB", kind="bar", horizontal=True,
              note="no peak-memory measurements yet\n(GPU benchmark JSONs add them)"),
    ]
