"""The plan of `analyses/run_all.py`: which scripts to run, with which arguments, in which
order, and running such a plan step by step with progress lines and a status per step.

Steps name scripts by their file name in `analyses/`; the caller supplies `script(name,
argv)`, a callable that runs one (the driver imports it in-process), so this module does not
depend on where the scripts live. Regenerating reads committed stores only and loads no
model; the small pipeline makes data, decodes and analyses on smollm2-135m.
"""

from __future__ import annotations

import glob
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dysco_interp.heads import available_shipped_heads
from dysco_interp.models import load_tokenizer
from dysco_interp.stores.archives import glob_stores
from dysco_interp.tasks import make_dataset, save_dataset
from dysco_interp.tasks.lengths import parse_length

SMALL_MODEL = "smollm2-135m"
SMALL_LENGTH = "1k"
SMALL_N = 2
SMALL_SEEDS = {"path_traversal": 0, "mrcr": 100}  # MRCR tuning data never shares a seed with test data
# what the committed overhead figure draws from (paths under the figures folder)
REGENERATE_OVERHEAD_MODELS = "qwen2.5-coder-0.5b,qwen2.5-coder-1.5b"

Runner = Callable[[], object]  # returns a script's exit status (or None)
ScriptRunner = Callable[[str, list[str]], Runner]  # (script name, argv) -> a runner of it


@dataclass
class Step:
    name: str
    run: Runner
    needs: list[str] = field(default_factory=list)  # glob patterns (`glob_stores`); none matching -> skipped
    outputs: list[str] = field(default_factory=list)  # glob patterns of what it writes


def _matches(patterns: list[str]) -> list[str]:
    return sorted({p for pattern in patterns for p in glob.glob(pattern)})


def run_steps(steps: list[Step], log: Callable[[str], None] = print) -> list[dict]:
    """Run each step in order with progress lines; a failure is recorded, not raised."""
    results = []
    for i, step in enumerate(steps, 1):
        t0 = time.perf_counter()
        prefix = f"[run_all {i}/{len(steps)}] {step.name}"
        missing = [p for p in step.needs if not glob_stores(p)]
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


def table_steps(script: ScriptRunner, stores: Path, out: Path, overhead_argv: list[str]) -> list[Step]:
    """Tables and figures drawn from result stores under `stores`, written under `out`."""
    pt, mrcr = str(stores / "path_traversal" / "*.jsonl"), str(stores / "mrcr" / "*.jsonl")
    abl, rob = str(stores / "ablations" / "*.jsonl"), str(stores / "robustness" / "*.jsonl")
    reuse = str(stores / "reuse" / "*.jsonl")
    return [
        Step("Path Traversal table (UniAttnS tau chosen on MRCR)",
             script("pt_table", ["--stores", pt, "--tau-stores", mrcr, "--out", str(out / "path_traversal/table")]),
             needs=[pt], outputs=[str(out / "path_traversal/table.*")]),
        Step("ablation table", script("ablation_table", ["--stores", abl, "--out", str(out / "ablations/table")]),
             needs=[abl], outputs=[str(out / "ablations/table.*")]),
        Step("one-pass reuse variant vs DySCO",
             script("ablation_table", ["--stores", reuse, "--out", str(out / "reuse/table")]),
             needs=[reuse], outputs=[str(out / "reuse/table.*")]),
        Step("robustness figure",
             script("robustness", ["--stores", rob, "--out", str(out / "robustness/robustness")]),
             needs=[rob], outputs=[str(out / "robustness/robustness.*")]),
        Step("overhead (FLOPs estimate, measured speed and memory)",
             script("overhead", [*overhead_argv, "--out", str(out / "overhead/overhead")]),
             outputs=[str(out / "overhead/overhead.*")]),
    ]


def draw_head_heatmap(heads, name: str, fig_dir: Path) -> tuple[Path, Path]:
    """The QRScore heatmap of a head set (`HeadSet`), from the score matrix it carries, as
    `fig_dir/<name>_qrscore_heatmap.{png,html}` with its heads framed; returns (png, html)."""
    from dysco_interp.detection.shipping import score_matrix
    from dysco_interp.viz.heatmap import save_head_heatmaps

    scores, scored = score_matrix(heads)
    return save_head_heatmaps(scores, fig_dir / f"{name}_qrscore.json", model=name, method=heads.method,
                              scored=scored, highlight=list(heads), n_examples=heads.n_examples)


def draw_shipped_heatmap(alias: str, fig_dir: Path) -> tuple[Path, Path]:
    """The QRScore heatmap of a packaged head file, as `analyses/ship_heads.py --figures-only`
    draws it, but into `fig_dir`."""
    from dysco_interp.heads import shipped_heads

    return draw_head_heatmap(shipped_heads(alias), alias, fig_dir)


def heatmap_runner(alias: str, fig_dir: Path) -> Runner:
    def run() -> None:
        draw_shipped_heatmap(alias, fig_dir)

    return run


def regenerate_steps(script: ScriptRunner, root: Path) -> list[Step]:
    """Every table and figure from the stores under `root`, written next to them, and the QRScore
    heatmaps of the packaged head files into `root/heads`. `root` is spelled as the recorded
    commands should name it (the driver runs from where `figures` means the folder)."""
    steps = table_steps(script, root, root, ["--models", REGENERATE_OVERHEAD_MODELS,
                                     "--bench", str(root / "bench_decode*.json"), str(root / "overhead/bench*.json"),
                                     "--stores", str(root / "path_traversal/*.jsonl")])
    for name, store in (("motivation", "motivation.jsonl"), ("first_error", "first_error.jsonl")):
        out = root / name
        steps.append(Step(f"{name} figure (from its stored records)",
                          script(name, ["--figures-only", "--out-dir", str(out)]),
                          needs=[str(out / store)], outputs=[str(out / "*.png"), str(out / "*.html")]))
    causal = root / "ablations_causal"
    steps.append(Step("causal head ablation figure (from its stored records)",
                      script("causal_ablation", ["--figures-only", "--out-dir", str(causal)]),
                      needs=[str(causal / "*.jsonl")],
                      outputs=[str(causal / "*_summary.json"), str(causal / "*.png"), str(causal / "*.html")]))
    budget = root / "budget"
    # the driver writes under <out-dir>/budget
    steps.append(Step("selection budget: dev curves and figure, dev free generation, test table",
                      script("budget_study", ["--figures-only", "--out-dir", str(root)]),
                      needs=[str(budget / "*" / "*.jsonl")],
                      outputs=[str(budget / f"{name}.*") for name in ("curves", "effect", "effect-fraction",
                                                                      "dev_free", "test_table")]))
    regime = root / "paper_regime"
    # the driver writes under <out-dir>/paper_regime, and the motivation figure to 128K beside it
    steps.append(Step("paper regime: presets against vanilla at 16K-127K, the dev rule, free generation, "
                      "Needle/MRCR, YaRN's cost, the gold edge's rank to 128K",
                      script("paper_regime", ["--figures-only", "--out-dir", str(root)]),
                      needs=[str(regime / "test" / "*.jsonl"), str(regime / "chosen_*.json")],
                      outputs=[str(regime / f"{name}.*") for name in ("test_tf", "effect", "yarn_cost", "free",
                                                                     "tasks", "dev_choice", "gold_rank")]
                      + [str(root / "motivation_128k" / "*.png"), str(root / "motivation_128k" / "*.html")]))
    account = root / "step_account"
    steps.append(Step("step account: what DySCO fixes and breaks by signal, free against forced, the gate",
                      script("step_account", ["--figures-only", "--out-dir", str(root)]),
                      needs=[str(account / "test" / "*_steps.jsonl")],
                      outputs=[str(account / f"{name}.*") for name in ("step_account", "examples", "signals")]))
    variance = root / "variance"
    steps.append(Step("variance: the small-budget effect under another machine, fp32 decode attention, another "
                      "head set",
                      script("variance_study", ["--figures-only", "--out-dir", str(root)]),
                      needs=[str(variance / "*.jsonl")], outputs=[str(variance / "*.md"), str(variance / "*.json"),
                                                                  str(variance / "*.png"), str(variance / "*.html")]))
    harness = root / "harness"
    steps.append(Step("steering harness: the leaderboard, which method works where, effect against cost, DySCO's "
                      "variants against DySCO",
                      script("harness", ["--figures-only", "--out-dir", str(root)]),
                      needs=[str(harness / "test" / "*.jsonl")],
                      outputs=[str(harness / "leaderboard.*"), str(harness / "where_*"),
                               str(harness / "effect_cost_*"), str(harness / "variants.*")]))
    for alias in available_shipped_heads():
        steps.append(Step(f"QRScore heatmap {alias}",
                          heatmap_runner(alias, root / "heads"),
                          outputs=[str(root / "heads" / f"{alias}_qrscore_heatmap.*")]))
    return steps


def make_small_data(data_dir: Path, model: str) -> None:
    """Path Traversal and MRCR task files, SMALL_N instances at SMALL_LENGTH each."""
    tokenizer = load_tokenizer(model)
    for task, seed in SMALL_SEEDS.items():
        data = make_dataset(task, tokenizer, parse_length(SMALL_LENGTH), n=SMALL_N, seed=seed, progress=True)
        save_dataset(data_dir / f"{task}_{SMALL_LENGTH}.jsonl", data)


def small_steps(script: ScriptRunner, out: Path, model: str) -> list[Step]:
    """The whole pipeline small: data, every decoding part, the tables and figures from those
    stores, and the motivation and first-error analyses, all under `out`."""
    data = out / "data"

    def runs(part: str) -> Runner:
        return script("decoding_runs", ["--small", "--model", model, "--data-dir", str(data),
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
    steps += table_steps(script, out, out, overhead)
    for name in ("motivation", "first_error"):
        steps.append(Step(f"{name} (small run)", script(name, ["--small", "--out-dir", str(out / name)]),
                          outputs=[str(out / name / "*.png"), str(out / name / "*.html"),
                                   str(out / name / "*.json")]))
    return steps


