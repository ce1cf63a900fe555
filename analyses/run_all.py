"""Regenerate every table and figure from stored results, or run the whole pipeline small.

    python analyses/run_all.py                      # from the stores in figures/, into figures/
    python analyses/run_all.py --small --out-dir DIR  # smollm2-135m on the CPU, a few minutes

Default mode reads only stored results (loads no model): the Path Traversal table with
the MRCR tau choice, the ablation table, the robustness figure, the overhead figure, the
motivation and first-error figures (from their stored records) and the QRScore heatmaps
(from the shipped head files). A step whose inputs are missing is skipped and says so.

--small makes Path Traversal and MRCR data (1K tokens, 2 instances each), runs every
decoding experiment small with `decoding_runs.py --small` (the UniAttnS tau sweep on MRCR,
vanilla / UniAttnS at the chosen tau / DySCO, the ablations, and a 2-value grid per
parameter: the default and one other value; 8 new tokens), then draws every table and figure from
those stores, and runs the motivation and first-error analyses small. Everything goes
under --out-dir (a new temporary folder by default); OUT/run_all.json lists each step,
its status and its outputs.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ANALYSES = Path(__file__).resolve().parent
SMALL_MODEL = "smollm2-135m"
SMALL_LENGTH = "1k"
SMALL_N = 2
SMALL_SEEDS = {"path_traversal": 0, "mrcr": 100}  # MRCR tuning data never shares a seed with test data


def load_script(name: str):
    """An analyses/ script as a module (the folder is not a package)."""
    path = ANALYSES / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"analyses/{name}.py is missing")
    spec = importlib.util.spec_from_file_location(f"analyses_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass
class Step:
    name: str
    run: Callable[[], object]  # returns a script's exit status (or None)
    needs: list[str] = field(default_factory=list)  # glob patterns; none matching -> skipped
    outputs: list[str] = field(default_factory=list)  # glob patterns of what it writes


def _matches(patterns: list[str]) -> list[str]:
    return sorted({p for pattern in patterns for p in glob.glob(pattern)})


def run_steps(steps: list[Step], log=print) -> list[dict]:
    """Run each step in order with progress lines; a failure is recorded, not raised."""
    results = []
    for i, step in enumerate(steps, 1):
        t0 = time.perf_counter()
        prefix = f"[run_all {i}/{len(steps)}] {step.name}"
        missing = [p for p in step.needs if not glob.glob(p)]
        if step.needs and len(missing) == len(step.needs):
            reason = f"no inputs: nothing matches {', '.join(missing)}"
            log(f"{prefix}: skipped ({reason})")
            results.append({"step": step.name, "status": "skipped", "reason": reason, "seconds": 0.0, "outputs": []})
            continue
        log(f"{prefix} ...")
        try:
            rc = step.run()
            status, reason = ("ok", "") if rc in (0, None) else ("failed", f"exit status {rc}")
        except SystemExit as e:  # argparse and scripts that exit on bad input
            status, reason = ("ok", "") if e.code in (0, None) else ("failed", f"exit: {e.code}")
        except Exception as e:  # noqa: BLE001 -- one broken step must not hide the others' results
            traceback.print_exc()
            status, reason = "failed", f"{type(e).__name__}: {e}"
        seconds = round(time.perf_counter() - t0, 1)
        outputs = _matches(step.outputs)
        log(f"{prefix}: {status} in {seconds}s" + (f" ({reason})" if reason else "")
            + (f", {len(outputs)} outputs" if outputs else ""))
        results.append({"step": step.name, "status": status, "reason": reason, "seconds": seconds,
                        "outputs": outputs})
    return results


def _script(name: str, argv: list[str]) -> Callable[[], object]:
    return lambda: load_script(name).main(argv)


def table_steps(stores: Path, out: Path, overhead_argv: list[str]) -> list[Step]:
    """Tables and figures drawn from result stores under `stores`, written under `out`."""
    pt, mrcr = str(stores / "path_traversal" / "*.jsonl"), str(stores / "mrcr" / "*.jsonl")
    abl, rob = str(stores / "ablations" / "*.jsonl"), str(stores / "robustness" / "*.jsonl")
    reuse = str(stores / "reuse" / "*.jsonl")
    return [
        Step("Path Traversal table (UniAttnS tau chosen on MRCR)",
             _script("pt_table", ["--stores", pt, "--tau-stores", mrcr, "--out", str(out / "path_traversal/table")]),
             needs=[pt], outputs=[str(out / "path_traversal/table.*")]),
        Step("ablation table", _script("ablation_table", ["--stores", abl, "--out", str(out / "ablations/table")]),
             needs=[abl], outputs=[str(out / "ablations/table.*")]),
        Step("one-pass reuse variant vs DySCO", _script("ablation_table", ["--stores", reuse, "--out", str(out / "reuse/table")]),
             needs=[reuse], outputs=[str(out / "reuse/table.*")]),
        Step("robustness figure",
             _script("robustness", ["--stores", rob, "--out", str(out / "robustness/robustness")]),
             needs=[rob], outputs=[str(out / "robustness/robustness.*")]),
        Step("overhead (FLOPs estimate, measured speed and memory)",
             _script("overhead", [*overhead_argv, "--out", str(out / "overhead/overhead")]),
             outputs=[str(out / "overhead/overhead.*")]),
    ]


def regenerate_steps(figures: Path) -> list[Step]:
    rel = figures.resolve() == (REPO / "figures").resolve()
    root = Path("figures") if rel else figures  # committed outputs name repository paths only
    steps = table_steps(root, root, ["--models", "qwen2.5-coder-0.5b,qwen2.5-coder-1.5b",
                                     "--bench", str(root / "bench_decode*.json"), str(root / "overhead/bench*.json"),
                                     "--stores", str(root / "path_traversal/*.jsonl")])
    for name, store in (("motivation", "motivation.jsonl"), ("first_error", "first_error.jsonl")):
        out = root / name
        steps.append(Step(f"{name} figure (from its stored records)",
                          _script(name, ["--figures-only", "--out-dir", str(out)]),
                          needs=[str(out / store)], outputs=[str(out / "*.png"), str(out / "*.html")]))
    if rel:
        # the heatmaps' script writes into the repository's figures/heads
        for head_file in sorted((REPO / "dysco_interp" / "head_files").glob("*.json")):
            steps.append(Step(f"QRScore heatmap {head_file.stem}",
                              _script("ship_heads", ["--model", head_file.stem, "--figures-only"]),
                              outputs=[str(root / "heads" / f"{head_file.stem}_qrscore_heatmap.*")]))
    return steps


def make_small_data(data_dir: Path, model: str) -> None:
    from dysco_interp.models import load_tokenizer
    from dysco_interp.tasks import make_dataset, save_dataset
    from dysco_interp.tasks.common import parse_length

    tokenizer = load_tokenizer(model)
    for task, seed in SMALL_SEEDS.items():
        data = make_dataset(task, tokenizer, parse_length(SMALL_LENGTH), n=SMALL_N, seed=seed, progress=True)
        save_dataset(data_dir / f"{task}_{SMALL_LENGTH}.jsonl", data)


def small_steps(out: Path, model: str) -> list[Step]:
    data = out / "data"

    def runs(part: str) -> Callable[[], object]:
        return _script("decoding_runs", ["--small", "--model", model, "--data-dir", str(data),
                                         "--out-dir", str(out), "--parts", part])

    steps = [
        Step(f"make data: Path Traversal and MRCR, {SMALL_LENGTH}, {SMALL_N} instances",
             lambda: make_small_data(data, model), outputs=[str(data / "*.jsonl")]),
        Step("UniAttnS tau sweep on MRCR", runs("tau"), outputs=[str(out / "mrcr/*.jsonl")]),
        Step("Path Traversal: vanilla, UniAttnS (chosen tau), DySCO", runs("pt"),
             outputs=[str(out / "path_traversal/*.jsonl")]),
        Step("ablations: DySCO, random heads, static (both tasks)", runs("ablation"),
             outputs=[str(out / "ablations/*.jsonl")]),
        Step("robustness: p, K, beta one at a time (both tasks)", runs("robustness"),
             outputs=[str(out / "robustness/*.jsonl")]),
        Step("reuse: DySCO vs its one-pass variant (both tasks)", runs("reuse"), outputs=[str(out / "reuse/*.jsonl")]),
    ]
    overhead = ["--models", f"qwen2.5-coder-0.5b,{model}", "--bench",
                "--stores", str(out / "path_traversal/*.jsonl"), str(out / "ablations/*.jsonl")]
    steps += table_steps(out, out, overhead)
    for name in ("motivation", "first_error"):
        steps.append(Step(f"{name} (small run)", _script(name, ["--small", "--out-dir", str(out / name)]),
                          outputs=[str(out / name / "*.png"), str(out / name / "*.html"),
                                   str(out / name / "*.json")]))
    return steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="run the whole pipeline small on the CPU (a few minutes)")
    p.add_argument("--out-dir", default=None, help="--small: where everything goes (default: a new temp folder)")
    p.add_argument("--model", default=SMALL_MODEL, help="--small: the model (default smollm2-135m)")
    p.add_argument("--figures-dir", default=str(REPO / "figures"),
                   help="default mode: the stores to read and the folder to write (default: figures/)")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    if args.small:
        out = Path(args.out_dir or tempfile.mkdtemp(prefix="dysco_run_all_")).resolve()
        out.mkdir(parents=True, exist_ok=True)
        print(f"[run_all] small pipeline on {args.model} into {out}", flush=True)
        steps = small_steps(out, args.model)
        summary_dir = out
    else:
        figures = Path(args.figures_dir)
        print(f"[run_all] regenerating from the stores in {figures}", flush=True)
        steps = regenerate_steps(figures)
        summary_dir = None  # no extra file among the committed figures

    def log(msg):
        print(msg, flush=True)

    if not args.small and Path(args.figures_dir).resolve() == (REPO / "figures").resolve():
        import os

        # relative paths inside the commands the outputs record
        os.chdir(REPO)
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
