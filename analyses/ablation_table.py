"""Ablation table: DySCO vs random heads vs static selection (and the one-pass reuse variant),
Path Traversal and MRCR, per length.

Variants are compared at equal DySCO parameters (read from each record's config); each
variant also gets its paired difference to DySCO on the same instances, with 95% bootstrap CIs.
Writes STEM.md and STEM.json.

    python analyses/ablation_table.py --stores 'figures/ablations/*.jsonl' --out figures/ablations/table
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.analysis.report import command_line, write_report
from dysco_interp.errors import DyscoError
from dysco_interp.studies.table_reports import ablation_result, ci_options, render_ablation_table, table_arguments

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "analyses/ablation_table.py"


def parse_args(argv):
    p = table_arguments(__doc__.splitlines()[0], stores=[str(REPO / "figures/ablations/*.jsonl")],
                        stores_help="result stores (glob patterns; quote them)",
                        out=str(REPO / "figures/ablations/table"), out_help="writes OUT.md and OUT.json")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = command_line(SCRIPT, argv if argv is not None else sys.argv[1:])
    try:
        result = ablation_result(args.stores, ci_options(args), command, REPO)
    except DyscoError as e:
        print(f"ablation_table: {e}", file=sys.stderr)
        return 2
    write_report(args.out, result, render_ablation_table(result))
    print(f"wrote {args.out}.md and {args.out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
