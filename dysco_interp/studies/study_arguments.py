"""The flags that the studies' scripts share, defined once so they read alike: the head studies'
(analyses/motivation.py, analyses/causal_ablation.py: the QRHeads against seeded random draws and
a small CPU smoke-run preset) and the split studies' (analyses/paper_regime.py,
analyses/step_account.py: dev and test task files, batches sized in prompt tokens)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.cli import user_methods
from dysco_interp.errors import ConfigError, DyscoError


def add_head_study_arguments(p: argparse.ArgumentParser, full: Mapping, small: Mapping, *, small_help: str,
                             data_help: str) -> None:
    """--model/--lengths/--n (None: from `full`, or `small` with --small), the heads and random draws,
    --data-dir, --device/--dtype/--threads, --out-dir, --n-boot, --small, --figures-only, --no-figures."""
    p.add_argument("--model", default=None, help=f"registry alias or folder (default {full['model']}; "
                   "with --figures-only: every model in the store)")
    p.add_argument("--lengths", default=None, help=f"default {full['lengths']}")
    p.add_argument("--n", type=int, default=None, help=f"instances per task and length (default {full['n']})")
    p.add_argument("--heads", default="shipped", help="the QRHeads: 'shipped' or a head file")
    p.add_argument("--draws", type=int, default=5, help="random head sets (same size as the QRHeads)")
    p.add_argument("--head-seed", type=int, default=0, help="seed of the first random head set")
    p.add_argument("--data-dir", default=None, help=data_help)
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on CPU, bf16 on GPU)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out-dir", type=cli_args.output_folder, default=None,
                   help=f"default {full['out_dir']} ({small['out_dir']} with --small)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--small", action="store_true", help=small_help)
    p.add_argument("--figures-only", action="store_true", help="draw from the stored records; loads no model")
    p.add_argument("--no-figures", action="store_true", help="compute only (write the summary JSON, no drawing)")


def add_split_study_arguments(p: cli_args.ArgumentParser, *, data_help: str) -> None:
    """--model, --data-dir, --out-dir, --parts/--lengths (the study adds its own), --device/--dtype,
    --backend, --tokens-per-batch, --n, --heads, --figures-only and --methods-from."""
    from dysco_interp.decoding.choices import BACKENDS

    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--data-dir", default=None, help=data_help)
    p.add_argument("--out-dir", type=cli_args.output_folder, default="figures")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--backend", default="static", choices=list(BACKENDS))
    p.add_argument("--tokens-per-batch", type=cli_args.positive_int, default=512 * 1024,
                   help="instances decoded together hold about this many prompt tokens")
    p.add_argument("--n", type=cli_args.positive_int, default=None, help="instances per file (default: all)")
    p.add_argument("--heads", default="shipped")
    p.add_argument("--figures-only", action="store_true", help="tables and figures from the stores under --out-dir")
    user_methods.add_methods_from_flag(p)


def load_study_model(args: argparse.Namespace, yarn_factor: float | None = None):
    """(model, heads) from the split-study flags: --model on --device/--dtype, --heads resolved for it."""
    from dysco_interp.heads import resolve_heads
    from dysco_interp.models import load_model

    cli_args.show_warnings_as_lines(Path(sys.argv[0]).stem or "dysco-interp")  # a study's warnings, one line each
    model = load_model(args.model, device=args.device, dtype=args.dtype, progress=False, yarn_factor=yarn_factor)
    return model, resolve_heads(model, args.heads)


def print_reports(script: str, write: Callable[[], list[str]]) -> int:
    """A script's work, `write()`: each line it returns (the files it wrote, what it found) printed
    on its own line (exit 0), or what it refused on purpose (a DyscoError) as one line naming the
    script (exit 2)."""
    try:
        lines = write()
    except DyscoError as e:
        print(f"{script}: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


def run_study(script: str, args: argparse.Namespace, work: Callable[[], None],
              batch_flag: str = "--tokens-per-batch") -> int:
    """A study driver's work past its flags, `work()`, and its exit code: 0 done, a refusal (a
    ConfigError) as one line naming the script (exit 2), and the device running out of memory as
    one line naming `batch_flag`, the flag that sizes its batches (exit 1: the stores keep every
    finished record, and the same command resumes)."""
    try:
        work()
        return 0
    except ConfigError as e:
        print(f"{script}: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        line = cli_args.out_of_memory(e)
        if line is None:
            raise
        now = getattr(args, batch_flag.lstrip("-").replace("-", "_"))
        print(f"{script}: {line}; the stores keep every finished record and the same command resumes: lower "
              f"{batch_flag} (now {now:,}) or run fewer processes on the device", file=sys.stderr)
        return 1


def apply_preset(p: argparse.ArgumentParser, args: argparse.Namespace, full: Mapping, small: Mapping) -> None:
    """Fill what was not given from the preset (the model only when one is loaded); refuse counts < 1."""
    preset = small if args.small else full
    for name in ("lengths", "n", "out_dir"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    if args.model is None and not args.figures_only:
        args.model = preset["model"]
    if args.n < 1 or args.draws < 1:
        p.error("--n and --draws must be >= 1")
