"""CPU time of `generate` idle and beside busy processes, torch's default threads vs the free-cores default.

What is timed and compared: dysco_interp/analysis/bench_threads.py.

    python analyses/bench_threads.py --model smollm2-135m --lines 80 --max-new-tokens 64 --repeats 2 \
        --busy 2 --out figures/bench_threads.json

With --readme, the README's first Python block instead, run as written (load_model's thread rule)
and after torch.set_num_threads(torch's default), idle and beside --busy busy loops:

    python analyses/bench_threads.py --readme --repeats 2 --busy 4 --out figures/bench_threads_readme.json
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import torch

from dysco_interp.analysis.bench import provenance
from dysco_interp.analysis.bench_threads import measure, measure_block, prompt_text
from dysco_interp.analysis.report import command_line, write_json
from dysco_interp.cli import args as cli_args
from dysco_interp.errors import ConfigError


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--lines", type=cli_args.positive_int, default=80,
                   help="key-value lines of the prompt (80: about 1K tokens with smollm2-135m)")
    p.add_argument("--max-new-tokens", type=cli_args.positive_int, default=64)
    p.add_argument("--repeats", type=cli_args.positive_int, default=2, help="runs of each setting in each phase")
    p.add_argument("--busy", type=cli_args.positive_int, default=2, help="busy-loop processes of the loaded phase")
    p.add_argument("--warmup", type=cli_args.nonnegative_float, default=20.0,
                   help="seconds the busy loops run before the first loaded run")
    p.add_argument("--readme", action="store_true",
                   help="time the README's first Python block (its model), not a generate run")
    p.add_argument("--out", type=cli_args.output_file, default=None,
                   help="figures/bench_threads.json (figures/bench_threads_readme.json with --readme)")
    args = p.parse_args(argv)
    if args.readme:
        return readme_block(args, argv)
    args.out = args.out or "figures/bench_threads.json"
    with tempfile.TemporaryDirectory(prefix="threads-bench-") as work:
        prompt = Path(work) / "prompt.txt"
        prompt.write_text(prompt_text(args.lines), encoding="utf-8")
        try:
            result = measure(args.model, prompt, args.max_new_tokens, args.repeats, args.busy, args.warmup)
        except ConfigError as e:
            raise SystemExit(str(e)) from None
    write_json(args.out, {
        "benchmark": "threads-under-load",
        "model": args.model,
        **provenance(torch.device("cpu")),
        "command": command_line("analyses/bench_threads.py", argv),
        **result,
    })
    for setting, row in result["summary"].items():
        print(f"{setting}: loaded/idle CPU time {row['loaded_over_idle_cpu']:.2f}, "
              f"wall {row['loaded_over_idle_wall']:.2f} (threads {row['threads']})")
    print(f"wrote {args.out}")
    return 0


def readme_block(args, argv) -> int:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = re.findall(r"```python\n(.*?)```", readme, flags=re.S)[0]
    try:
        result = measure_block(block, args.repeats, args.busy, args.warmup)
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    out = args.out or "figures/bench_threads_readme.json"
    write_json(out, {"benchmark": "readme-first-block-under-load", **provenance(torch.device("cpu")),
                     "command": command_line("analyses/bench_threads.py", argv), "block": block, **result})
    for setting, row in result["summary"].items():
        print(f"{setting}: idle {row['idle_wall_s']:.1f}s, loaded {row['loaded_wall_s']:.1f}s wall "
              f"({row['loaded_over_idle_wall']:.2f}x)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
