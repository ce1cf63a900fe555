"""Per-step classes of two teacher-forced runs: the pure classification and the command."""

import json
from pathlib import Path

import pytest

from dysco_interp.analysis.step_classes import class_of, class_rates, classify, units_of
from dysco_interp.cli import main
from dysco_interp.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def rec(method: str, instance: str, correct: list[bool], margins=None, field="tf_step_correct") -> dict:
    r = {"model": "m", "task": "path_traversal", "length": 1024, "instance": instance, "method": method,
         field: correct, "tf_step_accuracy": sum(correct) / len(correct)}
    if margins is not None:
        r["tf_step_margin"] = margins
    return r


def test_each_step_falls_in_one_class():
    assert [class_of(a, b) for a, b in ((False, True), (True, False), (True, True), (False, False))] == \
        ["fixed", "broken", "both right", "both wrong"]


def test_the_classes_decompose_the_paired_gain():
    base = [rec("vanilla", "a", [True, False, False, True], [0.5, 0.1, 2.0, 1.0]),
            rec("vanilla", "b", [False, False, True, True]), rec("vanilla", "only-base", [True] * 4)]
    other = [rec("dysco", "a", [True, True, False, False]), rec("dysco", "b", [True, False, True, True])]
    rows = classify(base, other)
    assert len(rows) == 8 and {r["instance"] for r in rows} == {"a", "b"}  # unpaired instances drop out
    a = [r for r in rows if r["instance"] == "a"]
    assert [r["class"] for r in a] == ["both right", "fixed", "both wrong", "broken"]
    assert a[1]["base_margin"] == 0.1 and "other_margin" not in a[1] and a[0]["unit"] == "route step"
    (rates,) = class_rates(rows, n_boot=200)
    assert rates["counts"] == {"fixed": 2, "broken": 1, "both right": 3, "both wrong": 2}
    assert rates["instances"] == 2 and rates["steps"] == 8
    gain = sum(o["tf_step_accuracy"] - b["tf_step_accuracy"] for o, b in zip(other, base)) / 2
    assert rates["net"]["mean"] == pytest.approx(gain)  # net is the paired difference in step accuracy
    assert sum(rates["rates"][c]["mean"] for c in rates["counts"]) == pytest.approx(1.0)


def test_tokens_are_the_steps_where_a_task_has_no_route_steps_and_mismatches_are_refused():
    rows = classify([rec("vanilla", "a", [True, False], field="tf_token_correct")],
                    [rec("dysco", "a", [False, False], field="tf_token_correct")])
    assert [r["class"] for r in rows] == ["broken", "both wrong"] and rows[0]["unit"] == "gold token"
    with pytest.raises(ConfigError, match="different steps"):
        classify([rec("vanilla", "a", [True, False])], [rec("dysco", "a", [True, False, True])])
    with pytest.raises(ConfigError, match="per-step correctness"):
        units_of({"method": "vanilla", "instance": "a", "tf_step_accuracy": 0.5})


@pytest.mark.slow
def test_the_command_classifies_a_store_it_evaluated_and_refuses_one_without_steps(tmp_path, data_dir, capsys,
                                                                                     error_line):
    heads = tmp_path / "h.json"
    heads.write_text(json.dumps({"heads": [[1, 0], [2, 1]]}))
    store = tmp_path / "r.jsonl"
    assert main(["evaluate", "--model", "tiny-llama", "--task", "path_traversal", "--data", str(data_dir),
                 "--methods", "vanilla,dysco", "--heads", str(heads), "--teacher-forced", "--max-new-tokens", "110",
                 "--out", str(store), "--threads", "1"]) == 0
    capsys.readouterr()
    out = tmp_path / "classes.json"
    assert main(["step-classes", str(store), str(store), "--out", str(out), "--n-boot", "100"]) == 0
    printed = capsys.readouterr().out
    assert "against vanilla, per route step" in printed
    result = json.loads(out.read_text())
    assert result["other"]["method"] == "dysco" and result["steps"]
    assert sum(result["rates"][0]["counts"].values()) == len(result["steps"])
    # a store decoded before per-step scores were kept: one line, exit 2
    old = REPO / "figures/paper_regime/test/qwen2.5-coder-1.5b_path_traversal_16k_tf.jsonl.xz"
    assert main(["step-classes", str(old), str(old), "--other-method", "dysco K=8 p=0.975 beta=1.5"]) == 2
    assert "per-step correctness" in error_line(capsys.readouterr().err)
