"""Teacher-forced presets against vanilla: each method's means and its paired difference to vanilla.

Pools the result stores (they must agree on every setting but the method's), groups the records
by model, task and length, and reports every method found there with 95% bootstrap intervals,
and its paired difference to vanilla on the same instances. Writes OUT.md and OUT.json.

    python analyses/preset_table.py --stores 'figures/paper_regime/*.jsonl' --out figures/paper_regime/tf_table
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.analysis.records import load_deduplicated
from dysco_interp.analysis.report import command_line, fmt_ci, fmt_delta, store_notes, with_footer, write_report
from dysco_interp.analysis.result_tables import CIOptions, by_cell, method_rows, with_table_q
from dysco_interp.cli import args as cli_args
from dysco_interp.cli import user_methods
from dysco_interp.errors import DyscoError
from dysco_interp.viz.tables import table_markdown

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "analyses/preset_table.py"
METRICS = ("tf_step_accuracy", "tf_city_logprob")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stores", nargs="+", required=True, help="result stores (glob patterns; quote them)")
    p.add_argument("--out", type=cli_args.output_stem, required=True, help="writes OUT.md and OUT.json")
    p.add_argument("--n-boot", type=cli_args.positive_int, default=2000, help="bootstrap resamples")
    user_methods.add_methods_from_flag(p)
    args = p.parse_args(argv)
    ci = CIOptions(n_boot=args.n_boot)
    try:
        pooled, files, unmatched = load_deduplicated(args.stores)
        cells, dropped = by_cell(pooled.records)
        rows = method_rows(cells, METRICS, ci)
        with_table_q(rows)
    except DyscoError as e:
        p.error(str(e))
    result = {"table": "teacher-forced presets", "command": command_line(SCRIPT, argv), "ci": ci.description,
              "stores": [str(f.relative_to(REPO)) if f.is_relative_to(REPO) else str(f) for f in files],
              "rows": rows, "notes": pooled.notes(unmatched) + store_notes([], dropped)}
    body = [[r["model"], r["length"], r["method"], r["n"], *(fmt_ci(r["metrics"][m]) for m in METRICS),
             *(fmt_delta((r["delta"] or {}).get(m)) for m in METRICS)] for r in rows]
    text = with_footer(["# Teacher-forced presets against vanilla", "",
                        f"Mean over instances; {ci.description}. Δ: paired difference to vanilla on the same "
                        "instances.", "",
                        table_markdown(["model", "tokens", "method", "n", "step accuracy", "city log p",
                                        "Δ step accuracy", "Δ city log p"], body)], result)
    write_report(args.out, result, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
