"""Regenerate every table and figure from stored results, or run the whole pipeline small.

    python analyses/run_all.py                      # from the stores in figures/, into figures/
    python analyses/run_all.py --out-dir DIR        # the same, into a copy of figures/ in DIR
    python analyses/run_all.py --small --out-dir DIR  # smollm2-135m on the CPU, 16 min at load 3-6

Default mode reads only stored results (loads no model): the Path Traversal table with
the MRCR tau choice, the ablation table, the robustness figure, the overhead figure, the
motivation and first-error figures (from their stored records), the causal head-ablation
figure, the selection-budget curves, figure and tables, and the QRScore heatmaps (from the
shipped head files). A step whose inputs are missing is skipped and says so.

--small makes Path Traversal and MRCR data (1K tokens, 2 instances each), runs every
decoding experiment small with `decoding_runs.py --small` (the UniAttnS tau sweep on MRCR,
vanilla / UniAttnS at the chosen tau / DySCO, the ablations, and a 2-value grid per
parameter: the default and one other value; 8 new tokens), then draws every table and figure from
those stores, and runs the motivation and first-error analyses small. Everything goes
under --out-dir (a new temporary folder by default); OUT/run_all.json lists each step,
its status and its outputs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.cli import user_methods
from dysco_interp.studies.pipeline import SMALL_MODEL, Runner, regenerate_steps, run_steps, small_steps

REPO = Path(__file__).resolve().parents[1]
ANALYSES = Path(__file__).resolve().parent


def load_script(name: str):
    """An analyses/ script as a module (the folder is not a package)."""
    path = ANALYSES / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"analyses/{name}.py is missing")
    spec = importlib.util.spec_from_file_location(f"analyses_{name}", path)
    assert spec is not None and spec.loader is not None  # a .py file always has a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def script(name: str, argv: list[str]) -> Runner:
    return lambda: load_script(name).main(argv)


def redraw_root(figures: Path, out_dir: str | None, stack: contextlib.ExitStack) -> Path:
    """The folder to redraw, spelled `figures` from a working directory where that name means it,
    so that every recorded command is the same whichever folder is written.

    Without --out-dir (or with --out-dir naming the figures folder itself) it is `figures`;
    otherwise `figures` is copied into --out-dir first and everything is redrawn in the copy,
    so nothing outside --out-dir is written and `diff -r figures OUT` shows what a redraw changes.
    """
    target = figures.resolve()
    if out_dir is not None and Path(out_dir).resolve() != target:
        target = Path(out_dir).resolve()
        shutil.copytree(figures, target, dirs_exist_ok=True)
    if target == (REPO / "figures").resolve():
        cwd = REPO
    else:
        cwd = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dysco_run_all_cwd_")))
        (cwd / "figures").symlink_to(target, target_is_directory=True)
    previous = Path.cwd()
    os.chdir(cwd)
    stack.callback(os.chdir, previous)
    return Path("figures")


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true",
                   help="run the whole pipeline small on the CPU (16 minutes on a loaded 2-core machine)")
    p.add_argument("--out-dir", type=cli_args.output_folder, default=None,
                   help="--small: where everything goes (default: a new temp folder); default mode: redraw a copy "
                        "of the figures folder here instead of the folder itself")
    p.add_argument("--model", default=SMALL_MODEL, help="--small: the model (default smollm2-135m)")
    p.add_argument("--figures-dir", default=str(REPO / "figures"),
                   help="default mode: the stores to read and the folder to write (default: figures/)")
    user_methods.add_methods_from_flag(p)
    args = p.parse_args(argv)

    def log(msg):
        print(msg, flush=True)

    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.small:
            out = Path(args.out_dir or tempfile.mkdtemp(prefix="dysco_run_all_")).resolve()
            out.mkdir(parents=True, exist_ok=True)
            print(f"[run_all] small pipeline on {args.model} into {out}", flush=True)
            steps = small_steps(script, out, args.model)
            summary_dir = out
        else:
            figures = Path(args.figures_dir)
            if not figures.is_dir():
                p.error(f"--figures-dir {figures} is not a folder")
            if args.out_dir and figures.resolve() in Path(args.out_dir).resolve().parents:
                p.error("--out-dir must not be inside --figures-dir (the figures are copied into it)")
            where = f" into {Path(args.out_dir).resolve()}" if args.out_dir else ""
            print(f"[run_all] regenerating from the stores in {figures}{where}", flush=True)
            steps = regenerate_steps(script, redraw_root(figures, args.out_dir, stack))
            summary_dir = None  # no extra file among the committed figures
        results = run_steps(steps, log)
    total = round(time.perf_counter() - t0, 1)
    width = max(len(r["step"]) for r in results)
    print(f"\n[run_all] done in {total}s")
    for r in results:
        print(f"  {r['step']:<{width}}  {r['status']:<8} {r['seconds']:>7.1f}s  {r['reason']}")
    if summary_dir is not None:
        (summary_dir / "run_all.json").write_text(json.dumps({"mode": "small", "model": args.model,
                                                              "seconds": total, "steps": results}, indent=1) + "\n")
        print(f"[run_all] outputs under {summary_dir} (summary: run_all.json)")
    return 1 if any(r["status"] == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
