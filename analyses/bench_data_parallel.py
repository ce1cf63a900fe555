"""Data-parallel evaluation throughput: the same evaluate under torchrun with 1, 2, 4 processes.

What is timed and compared: dysco_interp/analysis/bench_data_parallel.py.

    python analyses/bench_data_parallel.py --processes 1,2,4 --out figures/bench_data_parallel_1.5b.json -- \
        --model qwen2.5-coder-1.5b --task path_traversal --data data/ --methods vanilla,dysco --heads shipped \
        --backend static --batch-size 25
    # CPU, two gloo processes on a tiny model:
    python analyses/bench_data_parallel.py --processes 1,2 --out /tmp/dp.json -- --model tiny-llama \
        --task needle_qa --data data/ --methods vanilla --device cpu --threads 1

Everything after `--` goes to `dysco-interp evaluate` (without `--out`: each run writes a fresh
store under --work-dir).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from dysco_interp.analysis.bench import provenance
from dysco_interp.analysis.bench_data_parallel import scaling
from dysco_interp.analysis.report import command_line, write_json
from dysco_interp.cli import args as cli_args
from dysco_interp.errors import ConfigError


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, evaluate_args = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=cli_args.positive_ints, default="1,2",
                   help="process counts, comma-separated, the first one 1")
    p.add_argument("--work-dir", type=cli_args.output_folder, default=None,
                   help="where the runs' stores go (default: a new temporary folder)")
    p.add_argument("--out", type=cli_args.output_file, default="figures/bench_data_parallel.json")
    p.add_argument("--reuse", action="store_true",
                   help="read the runs already finished in --work-dir instead of repeating them (a sweep in pieces)")
    args = p.parse_args(ours)
    counts = args.processes
    if not evaluate_args:
        raise SystemExit("give the evaluate arguments after --, e.g. -- --model M --task T --data DIR")
    if "--out" in evaluate_args:
        raise SystemExit("leave --out out of the evaluate arguments: each run writes a fresh store under --work-dir")
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="dp-bench-"))
    try:
        result = scaling(counts, evaluate_args, work_dir, args.reuse)
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    cuda = torch.cuda.is_available() and "cpu" not in evaluate_args
    write_json(args.out, {
        "benchmark": "data-parallel-evaluate",
        "n_gpus": max(counts) if cuda else 0,
        "gpus_present": torch.cuda.device_count(),
        **provenance(torch.device("cuda:0" if cuda else "cpu")),
        "command": command_line("analyses/bench_data_parallel.py", argv),
        **result,
    })
    print(f"wrote {args.out}")
    return 0 if result["all_records_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
