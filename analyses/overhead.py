"""DySCO's overhead: an analytic FLOPs estimate (the paper's Qwen3-8B setting and ours) and
measured decode tokens/s and peak memory, vanilla vs DySCO on the same backend.

What is counted and read: dysco_interp/studies/overhead.py. Missing inputs are reported in
the outputs, not guessed. Writes STEM.{png,html,json,md}.

    python analyses/overhead.py --models qwen2.5-coder-0.5b --bench 'figures/bench_decode*.json' \
        --stores 'figures/path_traversal/*.jsonl' --out figures/overhead/overhead
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.analysis.report import command_line, write_report
from dysco_interp.cli import args as cli_args
from dysco_interp.cli import user_methods
from dysco_interp.errors import DyscoError
from dysco_interp.studies.overhead import measured, overhead_result, overhead_settings, panels, render
from dysco_interp.tasks.lengths import parse_lengths
from dysco_interp.viz.figures import save_panels

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "analyses/overhead.py"


def parse_args(argv):
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="qwen2.5-coder-0.5b", help="comma-separated model aliases with shipped heads")
    p.add_argument("--inputs", default="1k,2k,4k,8k", help="input lengths for our models")
    p.add_argument("--outputs", default="100,256", help="output lengths for our models")
    p.add_argument("--bench", nargs="*", default=[str(REPO / "figures/bench_decode*.json")],
                   help="benchmark JSON files (glob patterns)")
    p.add_argument("--stores", nargs="*", default=[str(REPO / "figures/path_traversal/*.jsonl")],
                   help="evaluation stores whose decode timings to summarise (glob patterns); stores of other "
                        "settings in one cell are refused (see dysco_interp/analysis/records.py)")
    user_methods.add_methods_from_flag(p)
    p.add_argument("--out", type=cli_args.output_stem, default=str(REPO / "figures/overhead/overhead"),
                   help="writes OUT.png, OUT.html, OUT.json, OUT.md")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        settings = overhead_settings([a for a in args.models.split(",") if a], parse_lengths(args.inputs),
                                     [int(x) for x in args.outputs.split(",")])
        meas, notes, sources = measured(args.bench, args.stores, REPO)
        result = overhead_result(settings, meas, notes, sources,
                                 command_line(SCRIPT, argv if argv is not None else sys.argv[1:]))
    except (DyscoError, ValueError) as e:
        print(f"overhead: {e}", file=sys.stderr)
        return 2
    save_panels(panels(settings, result["measured"]), Path(args.out),
                title="DySCO overhead: analytic FLOPs and measured speed/memory", ncols=2)
    write_report(args.out, result, render(result))
    print(f"wrote {args.out}.png/.html/.md/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
