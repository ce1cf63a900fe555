"""One name per meaning: DySCO's selection (--select-p/--select-k), sampling (--top-p/--top-k),
detect-heads' head count (--n-heads); the old spellings as aliases with a notice; one default
preset everywhere, named in the summaries; the heads and their origin in a run's first line."""

from __future__ import annotations

import json

import pytest

from dysco_interp.cli import main
from dysco_interp.cli.app import build_parser
from dysco_interp.decoding.choices import DEFAULT_PRESET
from dysco_interp.heads import HeadSet, describe_heads, resolve_heads_origin

GENERATE = ["generate", "--prompt", "x"]


def test_selection_and_sampling_have_their_own_names(capsys):
    args = build_parser().parse_args([*GENERATE, "--select-p", "0.5", "--select-k", "7", "--top-p", "0.9",
                                      "--top-k", "3"])
    assert (args.select_p, args.select_k, args.top_p, args.top_k) == (0.5, 7, 0.9, 3)
    assert capsys.readouterr().err == ""


def test_the_old_spellings_still_work_with_one_notice_each(capsys):
    args = build_parser().parse_args([*GENERATE, "--p", "0.5", "--k", "7"])
    assert (args.select_p, args.select_k) == (0.5, 7)
    assert capsys.readouterr().err.splitlines() == ["dysco-interp generate: note: --p is now --select-p",
                                                    "dysco-interp generate: note: --k is now --select-k"]
    args = build_parser().parse_args(["detect-heads", "--out", "h.json", "--top-k", "5"])
    assert args.n_heads == 5
    assert capsys.readouterr().err.splitlines() == ["dysco-interp detect-heads: note: --top-k is now --n-heads"]
    assert build_parser().parse_args(["detect-heads", "--out", "h.json"]).n_heads == 16


def test_an_old_spelling_with_a_bad_value_names_the_flag_as_typed(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*GENERATE, "--k", "0"])
    assert "argument --k: must be an integer >= 1, got 0" in capsys.readouterr().err


def test_help_shows_the_new_names_only(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    out = capsys.readouterr().out
    assert "--select-p" in out and "--select-k" in out and "--p " not in out and "--k " not in out


@pytest.mark.parametrize("argv", [GENERATE, ["evaluate", "--data", "d", "--out", "o.jsonl"], ["demo"]])
def test_every_command_has_the_same_default_preset(argv):
    assert DEFAULT_PRESET == "small-budget"
    assert build_parser().parse_args(argv).preset == DEFAULT_PRESET


def test_the_shipped_heads_say_where_they_come_from():
    heads, origin = resolve_heads_origin("smollm2-135m", "shipped")
    assert origin == "shipped for smollm2-135m (dysco_interp/heads/data/shipped/smollm2-135m.json)"
    line = describe_heads(heads, origin)
    assert line.startswith(f"heads: {len(heads)} {heads.method} heads shipped for smollm2-135m (") and "\n" not in line
    _, origin = resolve_heads_origin("tiny-llama", "1-0,2-3", label="--heads 1-0,2-3")
    assert origin == "from --heads 1-0,2-3"


@pytest.fixture
def head_file(tmp_path):
    path = tmp_path / "h.json"
    HeadSet([(1, 0), (2, 3)], model="tiny-llama", n_layers=4, n_heads=4, n_kv_heads=2).to_json(path)
    return path


def test_a_dysco_run_names_its_heads_first_and_its_preset(capsys, head_file):
    argv = ["generate", "--model", "tiny-llama", "--prompt", "hello", "--max-new-tokens", "2", "--device", "cpu",
            "--threads", "1", "--method", "dysco", "--heads", str(head_file)]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0] == f"heads: 2 manual heads from {head_file}: L1H0, L2H3"
    result = json.loads(captured.out)  # only JSON on stdout
    assert result["preset"] == DEFAULT_PRESET
    assert main([*argv, "--beta", "3"]) == 0
    assert f"[dysco, preset {DEFAULT_PRESET} (beta 3.0)]>" in capsys.readouterr().out


def test_a_vanilla_run_names_no_heads(capsys):
    assert main(["generate", "--model", "tiny-llama", "--prompt", "hello", "--max-new-tokens", "1", "--device", "cpu",
                 "--threads", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert "heads:" not in captured.err and json.loads(captured.out)["preset"] is None


def test_evaluate_names_the_preset_in_its_result_line(capsys, tmp_path, head_file):
    assert main(["make-data", "needle_qa", "--model", "tiny-llama", "--lengths", "600", "--n", "1",
                 "--out", str(tmp_path / "data")]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", "tiny-llama", "--task", "needle_qa", "--data", str(tmp_path / "data"),
                 "--methods", "vanilla,dysco", "--heads", str(head_file), "--out", str(tmp_path / "r.jsonl"),
                 "--max-new-tokens", "2", "--threads", "1", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0].startswith("heads: 2 manual heads from ")
    assert f"2 new records; DySCO methods: preset {DEFAULT_PRESET})" in captured.out


@pytest.mark.parametrize("script, old, new, value", [
    ("budget_study", "--k", "--select-ks", "8,16"), ("budget_study", "--p", "--select-ps", "0.9"),
    ("ship_heads", "--top-k", "--n-heads", "8"),
])
def test_the_analysis_scripts_use_the_same_names_and_keep_the_old_ones(script, old, new, value, capsys):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "analyses" / f"{script}.py"
    spec = importlib.util.spec_from_file_location(f"script_{script}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit):
        module.main(["--help"])
    shown = capsys.readouterr().out
    assert new in shown and f"{old} " not in shown
    # the old spelling is read and says its new name once (--help after it ends the run there)
    with pytest.raises(SystemExit):
        module.main([old, value, "--help"])
    assert capsys.readouterr().err.count(f"{old} is now {new}") == 1
