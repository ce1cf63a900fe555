"""The motivation study's stored records, their per-length summary and its figure.

Everything here reads the records only (numpy, no torch), so the figure can be drawn on a
machine without the model stack; `motivation` computes the records. Records live in
OUT_DIR/motivation.jsonl, one per (model, length, seed, index).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from dysco_interp.analysis.bootstrap import bootstrap_ci
from dysco_interp.analysis.report import write_json
from dysco_interp.errors import ConfigError
from dysco_interp.paths import safe_component
from dysco_interp.stores import store as runner
from dysco_interp.viz.figures import save_ci_lines
from dysco_interp.viz.panels import Panel, Series

TASK = "path_traversal"
HOPS = 4
STORE_NAME = "motivation.jsonl"
KEY = ("model", "task", "length", "seed", "index")
# Every series keeps its colour in every panel, model and format.
COLORS = {"teacher-forced accuracy": "#1f77b4", "QRHeads": "#d62728", "random heads": "#7f7f7f"}


def store_header(draws: int, head_seed: int, fraction: float) -> dict:
    """Settings every record in one store shares; reopening with others is an error."""
    return {"analysis": "motivation", "task": TASK, "hops": HOPS, "top_fraction": fraction,
            "random_draws": draws, "random_head_seed": head_seed,
            "query": "position predicting the first token of each step's city",
            "accuracy": "every token of the city name is the argmax (teacher forced)"}


def read_store(path: Path):
    """The settings and records of a motivation store, read without modifying it."""
    if not path.exists():  # anything there is judged by the reader
        raise ConfigError(f"no results at {path}; run the computation first (without --figures-only)")
    contents = runner.read_store(path)
    settings = contents.settings if contents is not None else None
    if not settings or settings.get("analysis") != "motivation":
        raise ConfigError(f"{path}: not a motivation store (no motivation settings header)")
    return settings, runner.ResultStore(path, KEY, settings, readonly=True).records()


def _step_values(record: dict, field: tuple[str, ...], step: int | None) -> float:
    """One instance's value: the given 1-based step, or the mean over its steps (None)."""
    node: Any = record
    for key in field:
        node = node[key]
    vals = [float(v) for v in node]
    return sum(vals) / len(vals) if step is None else vals[step - 1]


METRICS = {  # summary name -> record field
    "accuracy": ("correct",),
    "top_qrheads": ("qrheads", "gold_in_top"),
    "top_random": ("random", "gold_in_top"),
    "top_all_heads": ("all_heads", "gold_in_top"),
    "mass_qrheads": ("qrheads", "gold_mass"),
    "mass_random": ("random", "gold_mass"),
    "mass_all_heads": ("all_heads", "gold_mass"),
    "rank_qrheads": ("qrheads", "gold_rank"),
}


def summarise(records: list[dict], model: str, step: int, n_boot: int = 2000, seed: int = 0) -> dict:
    """Per length: mean and bootstrap CI over instances of every metric, at `step` and over all steps."""
    mine = [r for r in records if r["model"] == model]
    if not mine:
        raise ConfigError(f"no records of model {model!r}")
    hops = {len(r["correct"]) for r in mine}
    if not 1 <= step <= min(hops):
        raise ConfigError(f"--step must be between 1 and {min(hops)}, got {step}")
    rows = []
    for length in sorted({r["length"] for r in mine}):
        recs = sorted((r for r in mine if r["length"] == length), key=lambda r: (r["seed"], r["index"]))
        row = {"length": length, "n": len(recs), "dtype": sorted({r["dtype"] for r in recs}),
               "n_tokens": [min(r["n_tokens"] for r in recs), max(r["n_tokens"] for r in recs)]}
        for label, which in ((f"step_{step}", step), ("all_steps", None)):
            row[label] = {name: bootstrap_ci([_step_values(r, f, which) for r in recs],
                                             n_boot=n_boot, seed=seed).as_dict()
                          for name, f in METRICS.items()}
        row["mean_by_step"] = {name: [round(sum(_step_values(r, f, k) for r in recs) / len(recs), 5)
                                      for k in range(1, min(hops) + 1)] for name, f in METRICS.items()}
        rows.append(row)
    return {"model": model, "task": TASK, "figure_step": step, "ci": "95% percentile bootstrap over instances",
            "n_boot": n_boot, "bootstrap_seed": seed, "rows": rows}


def length_tick(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def figure_panels(summary: dict):
    """The three panels (accuracy, gold in top 5%, gold-edge mass) from a summary."""
    key = f"step_{summary['figure_step']}"
    rows = summary["rows"]

    def series(name: str, metric: str) -> Series:
        cis = [r[key][metric] for r in rows]
        return Series(name, [c["mean"] for c in cis], [c["lo"] for c in cis], [c["hi"] for c in cis], COLORS[name])

    # short titles (the edge is in the figure's title): three panels fit a narrow window
    return [
        Panel("Accuracy", "teacher-forced step accuracy",
              [series("teacher-forced accuracy", "accuracy")], ylim=(-0.02, 1.02)),
        Panel("Gold edge in the top 5%", "fraction of instances",
              [series("QRHeads", "top_qrheads"), series("random heads", "top_random")], ylim=(-0.02, 1.02)),
        Panel("Attention mass on the gold edge", "mean attention mass",
              [series("QRHeads", "mass_qrheads"), series("random heads", "mass_random")]),
    ]


def draw(out_dir: Path, store_path: Path, models: list[str] | None, step: int, n_boot: int, command: str,
         figures: bool = True) -> list[Path]:
    """<model>_summary.json, and unless `figures` is off <model>.png and <model>.html, for each model
    (its name made one file-name component, `paths.safe_component`)."""
    header, records = read_store(store_path)
    names = models or sorted({r["model"] for r in records})
    written = []
    for model in names:
        summary = summarise(records, model, step, n_boot=n_boot)
        summary.update({"settings": header, "source": store_path.name, "command": command})
        name = safe_component(model)  # a name from the store, never a path of its own
        written.append(write_json(out_dir / f"{name}_summary.json", summary))
        if not figures:
            continue
        try:
            n = sorted({r["n"] for r in summary["rows"]})
            title = (f"{model}: Path Traversal ({header['hops']} hops), teacher forced, edge {step}\nmean and 95% "
                     f"bootstrap CI over {n[0] if len(n) == 1 else f'{n[0]}-{n[-1]}'} instances per length")
            written += save_ci_lines(figure_panels(summary), [length_tick(r["length"]) for r in summary["rows"]],
                                     out_dir / name, title=title, xlabel="context length (tokens)")
        except ImportError as e:  # a compute-only machine: the numbers are written, the drawing waits
            print(f"not drawing ({e.name} is not installed); draw later with --figures-only", file=sys.stderr)
    return written


def print_summary(summary: dict) -> None:
    key = f"step_{summary['figure_step']}"
    print(f"{summary['model']} (step {summary['figure_step']}; all steps in brackets)")
    for r in summary["rows"]:
        s, a = r[key], r["all_steps"]
        print(f"  {r['length']:>6} tokens, n={r['n']}: "
              f"accuracy {s['accuracy']['mean']:.2f} [{a['accuracy']['mean']:.2f}]  "
              f"top-5% QRHeads {s['top_qrheads']['mean']:.2f} [{a['top_qrheads']['mean']:.2f}] vs random "
              f"{s['top_random']['mean']:.2f} [{a['top_random']['mean']:.2f}]  gold mass QRHeads "
              f"{s['mass_qrheads']['mean']:.4f} [{a['mass_qrheads']['mean']:.4f}] vs random "
              f"{s['mass_random']['mean']:.4f} [{a['mass_random']['mean']:.4f}]")
