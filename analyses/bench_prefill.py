"""Prefill time and peak memory: the runtime's prefill against a naive full bridge forward.

Each (method, length) runs in a fresh process so that peak memory is not polluted by
earlier runs; peak = highest resident memory sampled during the call minus the
resident memory just before it. One CPU thread, as the project's benchmarks require.

    python analyses/bench_prefill.py --model qwen2.5-coder-0.5b --lengths 1024,2048,4096,8192 \
        --out figures/bench_prefill.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from dysco_interp.analysis.bench_prefill import METHODS, measure_prefill, prefill_result
from dysco_interp.analysis.report import write_json
from dysco_interp.cli import args as cli_args


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--lengths", default="1024,2048,4096,8192")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--out", type=cli_args.output_file, default="figures/bench_prefill.json")
    p.add_argument("--child", nargs=2, metavar=("METHOD", "LENGTH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure_prefill(args.model, args.child[0], int(args.child[1]), args.chunk)))
        return 0

    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        for method in args.methods.split(","):
            cmd = [sys.executable, __file__, "--model", args.model, "--chunk", str(args.chunk),
                   "--child", method, str(length)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
                rows.append({"method": method, "length": length, "error": proc.stderr.strip().splitlines()[-1]})
            else:
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{length:>6} {method:24} {r.get('seconds', '-'):>9}s  peak +{r.get('peak_extra_mib', '-')} MiB",
                  flush=True)
    command = "python analyses/bench_prefill.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_json(args.out, prefill_result(args.model, args.chunk, command, rows))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
