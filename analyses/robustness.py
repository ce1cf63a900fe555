"""Hyper-parameter robustness of DySCO: p, K and beta moved one at a time around the paper's
defaults (p=0.975, K=4096, beta=2), metric vs value per task, default marked, 95% CIs.

A run counts for a parameter's curve when its config differs from the defaults in that
parameter only; the default run is the shared point of all three curves (it may come
from another store, e.g. the ablation store). Writes STEM.{png,html,json,md}.

    python analyses/robustness.py --stores 'figures/robustness/*.jsonl' 'figures/ablations/*.jsonl' \
        --out figures/robustness/robustness
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "analyses/robustness.py"
# (task, metric, axis label) per figure row
FIGURE_METRICS = (
    ("path_traversal", "accuracy", "Path Traversal accuracy"),
    ("path_traversal", "step_accuracy", "Path Traversal step accuracy"),
    ("mrcr", "score", "MRCR score"),
)
PARAM_LABELS = {"top_p": "nucleus mass p", "top_k": "cap K (tokens)", "beta": "strength beta"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stores", nargs="+",
                   default=[str(REPO / "figures/robustness/*.jsonl"), str(REPO / "figures/ablations/*.jsonl")],
                   help="result stores (glob patterns; quote them)")
    p.add_argument("--out", default=str(REPO / "figures/robustness/robustness"),
                   help="writes OUT.png, OUT.html, OUT.json, OUT.md")
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    return p.parse_args(argv)


def _series_name(point: dict, many_models: bool, many_settings: bool) -> str:
    name = f"{point['length']} tokens"
    if many_models:
        name = f"{point['model']}, {name}"
    if many_settings:
        name += f", {point['setting'].get('max_new_tokens')} new"
    return name


def panels(points: list[dict]):
    from dysco_interp.analysis.method_key import ROBUSTNESS_PARAMS, default_value
    from dysco_interp.viz.grid_plots import Line, Panel

    many_models = len({p["model"] for p in points}) > 1
    many_settings = len({(p["model"], p["task"], p["length"], tuple(p["setting"].items())) for p in points}) > len(
        {(p["model"], p["task"], p["length"]) for p in points})
    rows = [(t, m, label) for t, m, label in FIGURE_METRICS if any(p["task"] == t for p in points)]
    out = []
    for task, metric, label in rows:
        for param in ROBUSTNESS_PARAMS:
            series: dict[str, list[dict]] = {}
            for p in points:
                if p["task"] == task and p["param"] == param and p["metrics"].get(metric):
                    series.setdefault(_series_name(p, many_models, many_settings), []).append(p)
            lines = [Line(name, [p["value"] for p in pts], [p["metrics"][metric]["mean"] for p in pts],
                          [p["metrics"][metric]["lo"] for p in pts], [p["metrics"][metric]["hi"] for p in pts])
                     for name, pts in series.items()]
            out.append(Panel(f"{label} vs {PARAM_LABELS[param]}", PARAM_LABELS[param], label, lines,
                             log_x=param == "top_k", mark_x=default_value(param),
                             mark_label=f"default {default_value(param):g}", note="no runs"))
    return out


def render(result: dict) -> str:
    from dysco_interp.analysis.method_key import ROBUSTNESS_PARAMS
    from dysco_interp.analysis.report import fmt_ci, markdown_table, with_footer

    parts = ["# DySCO hyper-parameter robustness (one parameter at a time)", "",
             f"Mean over instances; {result['ci']}. Defaults: p=0.975, K=4096, beta=2."]
    for param in ROBUSTNESS_PARAMS:
        pts = [p for p in result["points"] if p["param"] == param]
        body = [[p["model"], p["task"], p["length"], p["setting"].get("max_new_tokens"),
                 f"{p['value']:g}" + (" (default)" if p["is_default"] else ""), p["n"],
                 "; ".join(f"{m} {fmt_ci(e)}" for m, e in p["metrics"].items())] for p in pts]
        parts += ["", f"## {PARAM_LABELS[param]}", "",
                  markdown_table(["model", "task", "length", "new tokens", "value", "n", "metrics"], body)
                  if body else "No runs."]
    return with_footer(parts, result)


def main(argv=None) -> int:
    args = parse_args(argv)
    from dysco_interp.analysis import result_tables as T
    from dysco_interp.analysis.report import command_line, store_notes, write_report
    from dysco_interp.analysis.stores import display_path, load_deduplicated
    from dysco_interp.errors import DyscoError
    from dysco_interp.viz.grid_plots import save_panels

    try:
        records, files, unmatched, dropped = load_deduplicated(args.stores)
        points, notes = T.robustness_points(records, T.CIOptions(args.n_boot, args.seed))
        if not points:
            raise DyscoError(f"no DySCO runs in {' '.join(args.stores)}")
    except DyscoError as e:
        print(f"robustness: {e}", file=sys.stderr)
        return 2
    notes = store_notes(unmatched, dropped) + notes
    result = {
        "figure": "robustness",
        "command": command_line(SCRIPT, argv if argv is not None else sys.argv[1:]),
        "ci": T.CIOptions(args.n_boot, args.seed).description,
        "stores": [display_path(f, REPO) for f in files],
        "points": points,
        "notes": notes,
    }
    grid = panels(points)
    models = ", ".join(sorted({p["model"] for p in points}))
    save_panels(grid, Path(args.out), title=f"DySCO robustness ({models}): one parameter at a time, 95% CI",
                ncols=3)
    write_report(args.out, result, render(result))
    print(f"wrote {args.out}.png/.html/.md/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
