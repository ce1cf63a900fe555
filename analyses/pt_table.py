"""Path Traversal table: vanilla / UniAttnS / DySCO per model and length, with 95% bootstrap CIs.

UniAttnS's temperature is chosen on MRCR-style data, as in the paper: per model, the tau
with the best mean MRCR score in the tau-sweep stores (ties -> the tau closest to 1).
Methods are told apart by each record's config, not by its label. Writes STEM.md and
STEM.json (rows, the tau sweep, notes on anything missing).

    python analyses/pt_table.py --stores 'figures/path_traversal/*.jsonl' \
        --tau-stores 'figures/mrcr/*.jsonl' --out figures/path_traversal/table
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "analyses/pt_table.py"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stores", nargs="+", default=[str(REPO / "figures/path_traversal/*.jsonl")],
                   help="Path Traversal result stores (glob patterns; quote them)")
    p.add_argument("--tau-stores", nargs="+", default=[str(REPO / "figures/mrcr/*.jsonl")],
                   help="MRCR UniAttnS tau-sweep stores (glob patterns)")
    p.add_argument("--out", default=str(REPO / "figures/path_traversal/table"), help="writes OUT.md and OUT.json")
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    return p.parse_args(argv)


def render(result: dict) -> str:
    from dysco_interp.analysis.report import fmt_ci, fmt_delta, markdown_table, with_footer

    body = []
    for r in result["rows"]:
        m, d = r["metrics"], r.get("delta") or {}
        body.append([r["model"], r["length"], r["setting"].get("max_new_tokens"), r["method"], r["n"],
                     fmt_ci(m.get("accuracy")), fmt_ci(m.get("step_accuracy")), fmt_ci(m.get("partial_accuracy")),
                     fmt_delta(d.get("accuracy")), fmt_delta(d.get("step_accuracy"))])
    parts = ["# Path Traversal: vanilla / UniAttnS / DySCO", "",
             f"Mean over instances; {result['ci']}. Δ: paired difference to vanilla on the same instances.", "",
             markdown_table(["model", "length", "new tokens", "method", "n", "accuracy (exact)", "step accuracy",
                             "partial accuracy", "Δ accuracy", "Δ step accuracy"], body), "",
             "## UniAttnS temperature, chosen on MRCR-style data", "", result["tau_rule"], ""]
    sweep = []
    for model, s in result["tau_selection"].items():
        for row in s["rows"]:
            chosen = "**chosen**" + (" (tie)" if s["tied"] else "") if row["tau"] == s["chosen_tau"] else ""
            sweep.append([model, f"{row['tau']:g}", row["n"], ",".join(map(str, row["lengths"])),
                          fmt_ci(row["score"]), chosen])
    parts.append(markdown_table(["model", "tau", "n", "lengths", "MRCR score", ""], sweep) if sweep
                 else "No MRCR tau-sweep records.")
    return with_footer(parts, result)


def main(argv=None) -> int:
    args = parse_args(argv)
    from dysco_interp.analysis import result_tables as T
    from dysco_interp.analysis.report import command_line, store_notes, write_report
    from dysco_interp.analysis.stores import display_path, load_records
    from dysco_interp.errors import DyscoError

    try:
        records, files, unmatched = load_records(args.stores)
        tau_records, tau_files, tau_unmatched = load_records(args.tau_stores)
        records, dropped = T.dedupe(records)
        if not any(r["task"] == "path_traversal" for r in records):
            raise DyscoError(f"no Path Traversal records in {' '.join(args.stores)}")
        ci = T.CIOptions(args.n_boot, args.seed)
        sweep = T.tau_sweep(T.dedupe(tau_records)[0], ci=ci)
        rows, notes = T.pt_table(records, {m: s["chosen_tau"] for m, s in sweep.items()}, ci)
    except DyscoError as e:
        print(f"pt_table: {e}", file=sys.stderr)
        return 2
    notes = store_notes(unmatched + tau_unmatched, dropped) + notes
    notes += [f"{m}: every tau in the MRCR sweep has the same mean score, so the data cannot choose; "
              f"the rule falls back to the tau closest to 1 ({s['chosen_tau']:g})"
              for m, s in sweep.items() if s["all_tied"]]
    result = {
        "table": "path_traversal",
        "command": command_line(SCRIPT, argv if argv is not None else sys.argv[1:]),
        "ci": T.CIOptions(args.n_boot, args.seed).description,
        "tau_rule": "Per model, the UniAttnS tau with the best mean MRCR score over the sweep stores "
                    "(all lengths pooled); ties go to the tau closest to 1.",
        "stores": [display_path(f, REPO) for f in files],
        "tau_stores": [display_path(f, REPO) for f in tau_files],
        "tau_selection": sweep,
        "rows": rows,
        "notes": notes,
    }
    write_report(args.out, result, render(result))
    print(f"wrote {args.out}.md and {args.out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
