"""Per-step classes of two teacher-forced runs: the pure classification and the command."""

import json
from pathlib import Path

import pytest

from dysco_interp.analysis.step_classes import class_of, class_rates, classify, trace_signals, units_of
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


def test_a_trace_says_what_the_run_selected_at_the_step_against_its_gold_span():
    trace = {"steps": [{"position": 9, "n_selected": None},
                       {"position": 10, "n_selected": 4, "nucleus_mass": 0.6, "selected": [2, 3, 7, 8],
                        "top_spans": [["edge1", 0.3], ["edge0", 0.2], ["edge4", 0.1]]}]}
    got = trace_signals(trace, 10, (2, 5), "edge0")
    assert got == {"n_selected": 4, "selected_mass": 0.6, "gold_selected_share": 0.5, "gold_top_span_rank": 2,
                   "gold_top_span_mass": 0.2, "top_span_share": pytest.approx(0.5)}
    assert trace_signals(trace, 10, (20, 30), "edge9")["gold_top_span_rank"] is None
    assert trace_signals(trace, 9, (2, 5), "edge0") == {} and trace_signals(trace, 11, (2, 5), "edge0") == {}


@pytest.mark.slow
def test_the_command_classifies_a_store_it_evaluated_and_refuses_one_without_steps(tmp_path, data_dir, capsys,
                                                                                     error_line):
    heads = tmp_path / "h.json"
    heads.write_text(json.dumps({"heads": [[1, 0], [2, 1]]}))
    store = tmp_path / "r.jsonl"
    assert main(["evaluate", "--model", "tiny-llama", "--task", "path_traversal", "--data", str(data_dir),
                 "--methods", "vanilla,dysco", "--heads", str(heads), "--teacher-forced", "--max-new-tokens", "110",
                 "--out", str(store), "--threads", "1", "--keep-trace"]) == 0
    capsys.readouterr()
    out = tmp_path / "classes.json"
    assert main(["step-classes", str(store), str(store), "--out", str(out), "--n-boot", "100"]) == 0
    printed = capsys.readouterr().out
    assert "against vanilla, per route step" in printed
    result = json.loads(out.read_text())
    assert result["other"]["method"] == "dysco" and result["steps"]
    assert sum(result["rates"][0]["counts"].values()) == len(result["steps"])
    # with the task file, each step also says what DySCO's trace held there against the gold edge
    data = next(Path(data_dir).glob("path_traversal_*.jsonl"))
    assert main(["step-classes", str(store), str(store), "--data", str(data), "--out", str(out), "--n-boot",
                 "100"]) == 0
    assert "OTHER's trace at the step" in capsys.readouterr().out
    # (a step past the 110 decoded tokens has no trace step: it counts as wrong, with no signals)
    steps = [s for s in json.loads(out.read_text())["steps"] if "other_n_selected" in s]
    assert len(steps) >= 3
    assert all(s["other_n_selected"] >= 1 and 0 < s["other_selected_mass"] <= 1 for s in steps)
    assert all(s["other_gold_top_span_rank"] in (None, 1, 2, 3) for s in steps)
    # a store that kept no traces cannot say what the run selected: one line, exit 2
    bare = tmp_path / "bare.jsonl"
    assert main(["evaluate", "--model", "tiny-llama", "--task", "path_traversal", "--data", str(data_dir),
                 "--methods", "vanilla,dysco", "--heads", str(heads), "--teacher-forced", "--max-new-tokens", "20",
                 "--out", str(bare), "--threads", "1"]) == 0
    capsys.readouterr()
    assert main(["step-classes", str(bare), str(bare), "--data", str(data)]) == 2
    assert "--keep-trace" in error_line(capsys.readouterr().err)
    # a store decoded before per-step scores were kept: one line, exit 2
    old = REPO / "figures/paper_regime/test/qwen2.5-coder-1.5b_path_traversal_16k_tf.jsonl.xz"
    assert main(["step-classes", str(old), str(old), "--other-method", "dysco K=8 p=0.975 beta=1.5"]) == 2
    assert "per-step correctness" in error_line(capsys.readouterr().err)
