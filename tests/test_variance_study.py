"""The variance study's report on synthetic stores (no model): each run's effect, each shift
against its own baseline, the vanilla drift, and what is missing said in a note."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dysco_interp.decoding.config import preset
from dysco_interp.studies.budget_study import FORCED_TOKENS, chosen_config
from dysco_interp.studies.variance_report import write_reports

REPO = Path(__file__).resolve().parents[1]
MODEL = "m"
CHOSEN = {"beta": 1.5, "top_p": 0.975, "top_k": 8, "top_k_fraction": None}


def record(config, index: int, step: float, city: float, machine: str) -> dict:
    return {"model": MODEL, "task": "path_traversal", "length": 2048, "method": config.method, "index": index,
            "id": f"path_traversal-s0-{index}-2048t", "instance": f"i{index}", "config": config.record_fields(),
            "tf_step_accuracy": step, "tf_city_logprob": city, "run": {"machine": machine}}


def write(path: Path, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture()
def out(tmp_path):
    vanilla = preset("paper", max_new_tokens=FORCED_TOKENS["path_traversal"]).replace(method="vanilla")
    chosen = chosen_config(CHOSEN, FORCED_TOKENS["path_traversal"])
    (tmp_path / "budget").mkdir()
    (tmp_path / "budget" / f"chosen_{MODEL}.json").write_text(json.dumps({"config": CHOSEN}))
    n = 12
    # the reference: the chosen configuration gains 0.25 step accuracy on every instance
    write(tmp_path / "budget/test" / f"{MODEL}_path_traversal_2k_tf.jsonl",
          [record(vanilla, i, 0.5, -2.0, "H100") for i in range(n)]
          + [record(chosen, i, 0.75, -1.5, "H100") for i in range(n)]
          + [record(vanilla.replace(method="uniattns").with_params(tau=0.9), i, 0.0, -9.0, "H200") for i in range(n)])
    # another machine: vanilla drifts on one instance, the effect stays
    write(tmp_path / "variance" / f"{MODEL}_path_traversal_2k_machine.jsonl",
          [record(vanilla, i, 0.5 if i else 0.25, -2.0, "H200") for i in range(n)]
          + [record(chosen, i, 0.75 if i else 0.5, -1.5, "H200") for i in range(n)])
    # another head set: half the gain
    write(tmp_path / "variance" / f"{MODEL}_path_traversal_2k_heads.jsonl",
          [record(chosen, i, 0.625 if i else 0.375, -1.75, "H200") for i in range(n)])
    return tmp_path


def test_each_run_is_paired_with_its_own_baseline(out):
    written = write_reports(out, lengths=("2k", "8k"))
    assert any(p.endswith(f"{MODEL}.md") for p in written) and any(p.endswith("_effect.png") for p in written)
    result = json.loads((out / "variance" / f"{MODEL}.json").read_text())
    rows = {(r["run"], r["metric"]): r for r in result["rows"]}
    ref, machine, heads = (rows[(run, "tf_step_accuracy")] for run in ("reference", "machine", "heads"))
    assert ref["effect"]["mean"] == pytest.approx(0.25) and ref["machine"] == "H100"  # UniAttnS's H200 left out
    assert machine["baseline"] == "reference" and machine["shift"]["mean"] == pytest.approx(0.0)
    assert machine["vanilla_drift"] == {"n": 12, "changed": 1, "max_abs": 0.25}
    assert "≡±0.03" in (out / "variance" / f"{MODEL}.md").read_text()  # a zero shift is shown equivalent
    assert heads["baseline"] == "machine" and heads["shift"]["mean"] == pytest.approx(-0.125)
    assert heads["shift"]["worse"] == 12 and heads["shift"]["q"] is not None
    assert "vanilla_drift" not in heads  # it reuses the machine run's vanilla
    assert any("no fp32 run" in n for n in result["notes"]) and any("8k" in n for n in result["notes"])


def test_the_driver_refuses_a_missing_choice_before_any_model_loads(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "analyses" / "variance_study.py"), "--model", MODEL,
                           "--data-dir", str(tmp_path), "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "budget study's choice" in proc.stderr and "Traceback" not in proc.stderr
