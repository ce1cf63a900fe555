"""What the project measured about DySCO's effect over many instances, shipped with the package.

The demo runs one instance, which is an example, not evidence; its page and report also show
what the selection-budget study measured (figures/README.md, "Selection budget"). An installed
package has no figures/ folder, so the numbers it shows travel as package data,
`data/measured_effect.json`, which `derive_evidence` makes from the committed study outputs
(tests/test_evidence.py checks that the shipped file is exactly what it derives, so the two
cannot drift):

- `test`: per model and prompt length, Path Traversal's test split teacher forced: step accuracy
  of vanilla and of the chosen small-budget DySCO, their paired difference with its 95% CI, and n
  (figures/budget/test_table.json);
- `curves`: the dev split's paired gain in step accuracy against the cap K, for the lines the
  demo draws (QRHeads at the chosen beta and at the paper's, random heads at the paper's), in
  the rows `viz.budget_figure.budget_panels` reads (figures/budget/curves.json.xz);
- `small`: the default model's teacher-forced run on the dev split (figures/budget/smollm2-135m_dev.jsonl.xz),
  recomputed from its records by the same bootstrap as the study's tables.

Regenerate after the study's outputs change: `python -m dysco_interp.experiments.evidence`.
"""

from __future__ import annotations

import argparse
import json
import lzma
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

DATA_NAME = "measured_effect.json"
BUDGET_DIR = Path("budget")  # under the figures folder
TEST_TABLE = BUDGET_DIR / "test_table.json"
CURVES = BUDGET_DIR / "curves.json.xz"  # committed compressed
SMALL_STORES = {"smollm2-135m": BUDGET_DIR / "smollm2-135m_dev.jsonl.xz"}
STEP_METRIC = "tf_step_accuracy"
CITY_METRIC = "tf_city_logprob"
TASK = "path_traversal"


# what a shipped estimate keeps: its mean and interval, and for a paired difference its exact test
_KEPT = ("mean", "lo", "hi", "n", "better", "worse", "same", "p", "q")


def _estimate(est: Mapping | None) -> dict | None:
    return None if est is None else {k: est[k] for k in _KEPT if est.get(k) is not None}


def _config(params: Mapping[str, Any]) -> dict:
    return {k: params.get(k) for k in ("beta", "top_p", "top_k")}


def test_rows(table: Mapping) -> dict[str, dict]:
    """Per model: the chosen configuration and, per length, vanilla, DySCO and their paired difference."""
    out: dict[str, dict] = {}
    rows = table["rows"]
    for model in sorted({r["model"] for r in rows}):
        by_role = {(r["length"], r["role"]): r for r in rows if r["model"] == model}
        lengths = sorted({length for length, role in by_role if role == "chosen"})
        chosen = [by_role[length, "chosen"] for length in lengths]
        out[model] = {"config": _config(chosen[0]["params"]), "rows": [{
            "length": length, "n": c["delta"][STEP_METRIC]["n"],
            "vanilla": _estimate(by_role[length, "vanilla"]["metrics"][STEP_METRIC]),
            "dysco": _estimate(c["metrics"][STEP_METRIC]),
            "delta": _estimate(c["delta"][STEP_METRIC]),
            "city_logprob_delta": _estimate(c["delta"][CITY_METRIC]),
        } for length, c in zip(lengths, chosen)]}
    return out


def curve_rows(curves: Mapping, chosen_beta: Mapping[str, float]) -> list[dict]:
    """The Path Traversal rows of the dev sweep that the demo's figure draws, with only the fields
    `budget_panels` reads: QRHeads at each model's chosen beta and at the paper preset's beta,
    random heads at the paper preset's beta, p fixed at the paper's, the cap as K."""
    from dysco_interp.analysis.result_tables import PAPER_PRESET

    keep = []
    for r in curves["rows"]:
        if (r["task"] != TASK or r["model"] not in chosen_beta or r["budget"][0] != "K" or r["other"]
                or r["top_p"] != PAPER_PRESET["top_p"] or r["gain"] is None):
            continue
        betas = {PAPER_PRESET["beta"], chosen_beta[r["model"]]} if r["heads"] == "qrheads" else {PAPER_PRESET["beta"]}
        if r["beta"] in betas:
            keep.append({
                **{k: r[k] for k in ("model", "task", "length", "heads", "beta", "top_p", "budget", "other",
                                     "head_seed", "metric", "n")},
                "gain": _estimate(r["gain"]), "vanilla": {r["metric"]: _estimate(r["vanilla"][r["metric"]])},
            })
    return keep


def small_run(path: Path) -> dict:
    """A teacher-forced vanilla vs DySCO store of one model, split and length: means and paired
    differences of step accuracy and the gold city's log-probability."""
    from dysco_interp.analysis.records import read_records
    from dysco_interp.analysis.result_tables import VANILLA, by_cell, metric_estimates, paired_deltas
    from dysco_interp.errors import ConfigError

    cells, _ = by_cell(read_records(path))
    if len(cells) != 1:
        raise ConfigError(f"{path}: expected one (model, task, length), found {len(cells)}")
    (model, task, length), by_key = next(iter(cells.items()))
    dysco = [k for k in by_key if k.method == "dysco"]
    if task != TASK or VANILLA not in by_key or len(dysco) != 1:
        raise ConfigError(f"{path}: expected Path Traversal runs of vanilla and one DySCO configuration")
    metrics = [STEP_METRIC, CITY_METRIC]
    vanilla, ours = by_key[VANILLA], by_key[dysco[0]]
    deltas = paired_deltas(ours, vanilla, metrics)
    return {"model": model, "length": length, "n": deltas[STEP_METRIC]["n"],
            "config": _config(dysco[0].params_dict()),
            "vanilla": {m: _estimate(e) for m, e in metric_estimates(vanilla, metrics).items()},
            "dysco": {m: _estimate(e) for m, e in metric_estimates(ours, metrics).items()},
            "delta": {m: _estimate(e) for m, e in deltas.items()}}


def derive_evidence(figures_dir: str | Path) -> dict:
    """The shipped evidence, from the committed outputs of the selection-budget study under `figures_dir`."""
    from dysco_interp.analysis.result_tables import CIOptions

    figures_dir = Path(figures_dir)
    table = json.loads((figures_dir / TEST_TABLE).read_text())
    curves = json.loads(lzma.decompress((figures_dir / CURVES).read_bytes()))
    test = test_rows(table)
    return {
        "about": "derived by dysco_interp.experiments.evidence.derive_evidence from the selection-budget "
                 "study's outputs (figures/README.md, 'Selection budget'); do not edit by hand",
        "task": TASK, "metric": STEP_METRIC, "ci": CIOptions().description,
        "test": {"split": table["split"], "source": f"figures/{TEST_TABLE.as_posix()}", "models": test},
        "curves": {"split": curves["split"], "source": f"figures/{CURVES.as_posix()}",
                   "rows": curve_rows(curves, {m: t["config"]["beta"] for m, t in test.items()})},
        "small": {model: {"split": "dev", "source": f"figures/{path.as_posix()}",
                          **small_run(figures_dir / path)} for model, path in SMALL_STORES.items()},
    }


def evidence_text(evidence: Mapping) -> str:
    """The shipped evidence as the JSON text the package holds (stable: sorted keys, one layout)."""
    return json.dumps(evidence, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


@cache
def load_evidence() -> dict:
    """The shipped evidence (`derive_evidence`'s output, read from the package)."""
    return json.loads(resources.files("dysco_interp.experiments").joinpath("data", DATA_NAME).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="rewrite the package's measured_effect.json from figures/")
    parser.add_argument("--figures", default="figures", help="the figures folder (default: figures)")
    args = parser.parse_args(argv)
    out = Path(__file__).parent / "data" / DATA_NAME
    out.parent.mkdir(exist_ok=True)
    out.write_text(evidence_text(derive_evidence(args.figures)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["DATA_NAME", "derive_evidence", "evidence_text", "load_evidence"]
