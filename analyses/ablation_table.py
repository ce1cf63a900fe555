"""Ablation table: DySCO vs random heads vs static selection (and the one-pass reuse variant),
Path Traversal and MRCR, per length.

Variants are compared at equal DySCO parameters (read from each record's config); each
variant also gets its paired difference to DySCO on the same instances, with 95% bootstrap CIs. Writes STEM.md and STEM.json.

    python analyses/ablation_table.py --stores 'figures/ablations/*.jsonl' --out figures/ablations/table
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "analyses/ablation_table.py"
TASK_NAMES = {"path_traversal": "Path Traversal", "mrcr": "MRCR"}
METRIC_NAMES = {"accuracy": "accuracy (exact)", "step_accuracy": "step accuracy",
                "partial_accuracy": "partial accuracy", "score": "score"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stores", nargs="+", default=[str(REPO / "figures/ablations/*.jsonl")],
                   help="result stores (glob patterns; quote them)")
    p.add_argument("--out", default=str(REPO / "figures/ablations/table"), help="writes OUT.md and OUT.json")
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    return p.parse_args(argv)


def render(result: dict) -> str:
    from dysco_interp.analysis.report import fmt_ci, fmt_delta, markdown_table, with_footer
    from dysco_interp.analysis.result_tables import DELTA_METRICS

    parts = ["# Ablations: DySCO vs random heads vs static selection vs one-pass reuse", "",
             f"Mean over instances; {result['ci']}. Δ: paired difference to DySCO on the same instances."]
    tasks = {r["task"] for r in result["rows"]}
    for task in [t for t in TASK_NAMES if t in tasks] + sorted(tasks - set(TASK_NAMES)):
        rows = [r for r in result["rows"] if r["task"] == task]
        metrics = list(rows[0]["metrics"])
        deltas = list(DELTA_METRICS.get(task, metrics))
        body = [[r["model"], r["length"], r["setting"].get("max_new_tokens"), r["method"], r["n"],
                 *(fmt_ci(r["metrics"].get(m)) for m in metrics),
                 *(fmt_delta((r.get("delta") or {}).get(m)) for m in deltas)] for r in rows]
        parts += ["", f"## {TASK_NAMES.get(task, task)}", "",
                  markdown_table(["model", "length", "new tokens", "method", "n",
                                  *(METRIC_NAMES.get(m, m) for m in metrics),
                                  *(f"Δ {METRIC_NAMES.get(m, m)}" for m in deltas)], body)]
    if not result["rows"]:
        parts += ["", "No ablation records."]
    return with_footer(parts, result)


def main(argv=None) -> int:
    args = parse_args(argv)
    from dysco_interp.analysis import result_tables as T
    from dysco_interp.analysis.report import command_line, store_notes, write_report
    from dysco_interp.analysis.stores import display_path, load_deduplicated
    from dysco_interp.errors import DyscoError

    try:
        records, files, unmatched, dropped = load_deduplicated(args.stores)
        rows, notes = T.ablation_table(records, T.CIOptions(args.n_boot, args.seed))
    except DyscoError as e:
        print(f"ablation_table: {e}", file=sys.stderr)
        return 2
    notes = store_notes(unmatched, dropped) + notes
    result = {
        "table": "ablations",
        "command": command_line(SCRIPT, argv if argv is not None else sys.argv[1:]),
        "ci": T.CIOptions(args.n_boot, args.seed).description,
        "stores": [display_path(f, REPO) for f in files],
        "rows": rows,
        "notes": notes,
    }
    write_report(args.out, result, render(result))
    print(f"wrote {args.out}.md and {args.out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
