"""Path Traversal table: vanilla / UniAttnS / DySCO per model and length, with 95% bootstrap CIs.

UniAttnS's temperature is chosen on MRCR-style data, as in the paper: per model, the tau
with the best mean MRCR score in the tau-sweep stores (ties -> the tau closest to 1).
Methods are told apart by each record's config, not by its label. Writes STEM.md and
STEM.json (rows, the tau sweep, notes on anything missing).

    python analyses/pt_table.py --stores 'figures/path_traversal/*.jsonl' \
        --tau-stores 'figures/mrcr/*.jsonl' --out figures/path_traversal/table
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.analysis.report import command_line, write_report
from dysco_interp.errors import DyscoError
from dysco_interp.studies.table_reports import ci_options, pt_table_result, render_pt_table, table_arguments

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "analyses/pt_table.py"


def parse_args(argv):
    p = table_arguments(__doc__.splitlines()[0], stores=[str(REPO / "figures/path_traversal/*.jsonl")],
                        stores_help="Path Traversal result stores (glob patterns; quote them)",
                        out=str(REPO / "figures/path_traversal/table"), out_help="writes OUT.md and OUT.json")
    p.add_argument("--tau-stores", nargs="+", default=[str(REPO / "figures/mrcr/*.jsonl")],
                   help="MRCR UniAttnS tau-sweep stores (glob patterns)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = command_line(SCRIPT, argv if argv is not None else sys.argv[1:])
    try:
        result = pt_table_result(args.stores, args.tau_stores, ci_options(args), command, REPO)
    except DyscoError as e:
        print(f"pt_table: {e}", file=sys.stderr)
        return 2
    write_report(args.out, result, render_pt_table(result))
    print(f"wrote {args.out}.md and {args.out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
