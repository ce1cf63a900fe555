"""Hyper-parameter robustness of DySCO: p, K and beta moved one at a time around the paper's
defaults (p=0.975, K=4096, beta=2), metric vs value per task, default marked, 95% CIs.

A run counts for a parameter's curve when its config differs from the defaults in that
parameter only; the default run is the shared point of all three curves (it may come
from another store, e.g. the ablation store). Writes STEM.{png,html,json,md}.

    python analyses/robustness.py --stores 'figures/robustness/*.jsonl' 'figures/ablations/*.jsonl' \
        --out figures/robustness/robustness
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.analysis.report import command_line, write_report
from dysco_interp.errors import DyscoError
from dysco_interp.studies.table_reports import (
    ci_options,
    render_robustness,
    robustness_panels,
    robustness_result,
    table_arguments,
)
from dysco_interp.viz.figures import save_panels

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "analyses/robustness.py"


def parse_args(argv):
    p = table_arguments(__doc__.splitlines()[0],
                        stores=[str(REPO / "figures/robustness/*.jsonl"), str(REPO / "figures/ablations/*.jsonl")],
                        stores_help="result stores (glob patterns; quote them)",
                        out=str(REPO / "figures/robustness/robustness"),
                        out_help="writes OUT.png, OUT.html, OUT.json, OUT.md")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = command_line(SCRIPT, argv if argv is not None else sys.argv[1:])
    try:
        result = robustness_result(args.stores, ci_options(args), command, REPO)
    except DyscoError as e:
        print(f"robustness: {e}", file=sys.stderr)
        return 2
    points = result["points"]
    models = ", ".join(sorted({p["model"] for p in points}))
    save_panels(robustness_panels(points), Path(args.out),
                title=f"DySCO robustness ({models}): one parameter at a time, DySCO minus vanilla on the same "
                      "instances, 95% CI", ncols=3)
    write_report(args.out, result, render_robustness(result))
    print(f"wrote {args.out}.png/.html/.md/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
