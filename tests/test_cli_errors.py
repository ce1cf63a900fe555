"""Bad input to the command line: one line on stderr, a non-zero exit, no traceback, and,
where the input can be checked without it, no model load first."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dysco_interp.cli import args as cli_args
from dysco_interp.cli import evaluate as evaluate_command
from dysco_interp.cli import models as models_command
from dysco_interp.cli.app import build_parser, main
from dysco_interp.models.tiny import tiny_tokenizer
from dysco_interp.tasks import make_dataset, save_dataset


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    (d / "folder").mkdir()
    (d / "latin1.txt").write_bytes("café".encode("latin-1"))
    (d / "empty.txt").write_text("")
    (d / "file.txt").write_text("not a folder")
    inst = make_dataset("needle_qa", tiny_tokenizer("llama"), 600, n=1)[0]
    save_dataset(d / "needle_qa_600.jsonl", [inst])
    line = json.dumps(inst.to_dict())
    (d / "truncated.jsonl").write_text(line + "\n" + line[: len(line) // 2])  # a write cut off mid-record
    (d / "binary.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (d / "empty.jsonl").write_text("\n\n")
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "deep.yaml").write_text("[" * 100_000 + "]" * 100_000)
    (d / "unhashable.yaml").write_text("? [[17, 3]]\n: [[1, 2]]\n")
    ours = json.loads((Path(__file__).parent / "data" / "heads" / "ours_tiny_llama.json").read_text())
    (d / "version0.json").write_text(json.dumps({**ours, "format_version": 0}))
    return d


GEN = ["generate", "--model", "tiny-llama", "--prompt", "hi"]


def evaluate(data: str = "{d}/needle_qa_600.jsonl") -> list[str]:
    return ["evaluate", "--model", "tiny-llama", "--task", "needle_qa", "--data", data, "--out", "{d}/results.jsonl"]


EVAL = evaluate()
DETECT = ["detect-heads", "--model", "tiny-llama", "--out", "{d}/h.json"]
MAKE = ["make-data", "needle_qa", "--model", "tiny-llama", "--out", "{d}/made"]

CASES = {
    "prompt file missing": (["generate", "--model", "tiny-llama", "--prompt-file", "{d}/missing.txt"],
                            "--prompt-file {d}/missing.txt: no such file"),
    "prompt file is a folder": (["generate", "--prompt-file", "{d}/folder"], "is a folder; name a text file"),
    "prompt file not UTF-8": (["generate", "--prompt-file", "{d}/latin1.txt"],
                              "is not UTF-8 text (byte 0xe9 at offset 3)"),
    "prompt file empty": (["generate", "--prompt-file", "{d}/empty.txt"], "--prompt-file {d}/empty.txt is empty"),
    "prompt empty": (["generate", "--prompt", " "], "--prompt is empty"),
    "data truncated": (evaluate("{d}/truncated.jsonl"),
                       "truncated.jsonl, line 2: not valid JSON ("),
    "data binary": (evaluate("{d}/binary.jsonl"),
                    "binary.jsonl, line 1: not UTF-8 text (byte 0x89 at column 1)"),
    "data empty": (evaluate("{d}/empty.jsonl"), "empty.jsonl holds no records"),
    "detect data truncated": ([*DETECT, "--data", "{d}/truncated.jsonl"], "truncated.jsonl, line 2: not valid JSON"),
    "detect data empty": ([*DETECT, "--data", "{d}/empty.jsonl"], "empty.jsonl holds no records"),
    "detect data typo": ([*DETECT, "--data", "needle-q"], "neither 'needle-qa' (generated) nor an existing JSONL"),
    "make-data out is a file": (["make-data", "needle_qa", "--out", "{d}/file.txt"],
                                "argument --out: {d}/file.txt is an existing file, not a folder"),
    "demo out is a folder": (["demo", "--out", "{d}/folder"], "argument --out: {d}/folder is a folder"),
    "demo out without .html": (["demo", "--out", "{d}/page"], "argument --out: {d}/page has no .html extension, "
                               "and the page opens in a browser by it: name it {d}/page.html"),
    "threads -1": ([*GEN, "--threads", "-1"], "argument --threads: must be an integer >= 1, got -1"),
    "threads 0": ([*EVAL, "--threads", "0"], "argument --threads: must be an integer >= 1, got 0"),
    "detect threads 0": ([*DETECT, "--threads", "0"], "argument --threads: must be an integer >= 1, got 0"),
    "demo threads -1": (["demo", "--threads", "-1"], "argument --threads: must be an integer >= 1, got -1"),
    "sampling seed 1e30": ([*GEN, "--temperature", "1", "--seed", str(10**30)],
                           f"argument --seed: must be an integer in 0..{2**63 - 1}, got {10**30}"),
    "head seed 1e30": ([*GEN, "--head-seed", str(10**30)], "argument --head-seed: must be an integer in 0.."),
    "make-data seed 1e30": ([*MAKE, "--seed", str(10**30)], "argument --seed: must be an integer in 0.."),
    "detect seed -1": ([*DETECT, "--seed", "-1"], "argument --seed: must be an integer in 0.."),
    "limit 0": ([*EVAL, "--limit", "0"], "argument --limit: must be an integer >= 1, got 0"),
    "limit negative": ([*EVAL, "--limit", "-2"], "argument --limit: must be an integer >= 1, got -2"),
    "batch size 0": ([*EVAL, "--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got 0"),
    "demo max-new-tokens 0": (["demo", "--max-new-tokens", "0"],
                              "argument --max-new-tokens: must be an integer >= 1, got 0"),
    "generate max-new-tokens 0": ([*GEN, "--max-new-tokens", "0"], "argument --max-new-tokens: must be"),
    "make-data n 0": ([*MAKE, "--n", "0"], "argument --n: must be an integer >= 1, got 0"),
    "make-data tolerance 1": ([*MAKE, "--tolerance", "1"], "argument --tolerance: must be a finite number > 0 and < 1"),
    "decode attention of another backend": ([*GEN, "--decode-attention", "float32"],
                                            "--decode-attention sets the static backend's decoding attention; "
                                            "add --backend static (the bridge backend has none)"),
    "evaluate decode attention of sdpa": ([*EVAL, "--backend", "sdpa", "--decode-attention", "float32"],
                                          "add --backend static (the sdpa backend has none)"),
    "decode attention unknown": ([*EVAL, "--backend", "static", "--decode-attention", "flash"],
                                 "argument --decode-attention: invalid choice: 'flash'"),
    "uniattns without tau": ([*GEN, "--method", "uniattns"], "uniattns needs --tau"),
    "evaluate uniattns without tau": ([*EVAL, "--methods", "vanilla,uniattns"], "uniattns needs --tau"),
    "unknown method": ([*EVAL, "--methods", "vanilla,dysko"], "argument --methods: unknown method(s) dysko"),
    "method twice": ([*EVAL, "--methods", "dysco,dysco"], "argument --methods: a method is named twice"),
    "unknown task": ([*EVAL, "--task", "path-travresal"],
                     "argument --task: unknown task 'path-travresal'; choose one of path_traversal, needle_qa, mrcr"),
    "no shipped heads for the model": ([*GEN, "--method", "dysco"], "no shipped head file for 'tiny-llama'"),
    "head file 100000 deep (JSON)": ([*GEN, "--method", "dysco", "--heads", "{d}/deep.json"],
                                     "deep.json: values nest more than 32 levels deep; not a head file"),
    "head file 100000 deep (YAML)": ([*GEN, "--method", "dysco", "--heads", "{d}/deep.yaml"],
                                     "deep.yaml: values nest more than 32 levels deep; not a head file"),
    "head file unhashable key": ([*GEN, "--method", "dysco", "--heads", "{d}/unhashable.yaml"],
                                 "unhashable.yaml: not valid safe YAML: unhashable key [[17, 3]] at line 1"),
    "head file format_version 0": ([*GEN, "--method", "dysco", "--heads", "{d}/version0.json"],
                                   "version0.json: 'format_version' must be 1 or more, got 0"),
    "demo head file 100000 deep": (["demo", "--heads", "{d}/deep.json", "--out", "{d}/r.html"],
                                   "values nest more than 32 levels deep"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_before_any_model_load(case, files, no_model, capsys, error_line):
    argv, expected = CASES[case]
    argv = [a.replace("{d}", str(files)) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    line = error_line(captured.err)
    assert line.startswith("dysco-interp") and ": error: " in line
    assert expected.replace("{d}", str(files)) in line
    assert captured.out == ""


def test_evaluate_defaults_to_methods_that_need_no_tuning():
    args = build_parser().parse_args(["evaluate", "--data", "d", "--out", "r.jsonl"])
    assert args.methods == "vanilla,dysco" and args.tau is None
    args = build_parser().parse_args(["evaluate", "--data", "d", "--out", "r.jsonl", "--methods",
                                      " vanilla, uniattns ", "--tau", "0.8"])
    assert args.methods == "vanilla,uniattns" and args.tau == 0.8


def test_make_data_refuses_lengths_beyond_the_context_and_writes_nothing(tmp_path, capsys, error_line):
    out = tmp_path / "data"
    # tiny models have a 2048-token context; 600 would be fine, 4k is checked before anything is made
    assert main(["make-data", "needle_qa", "--model", "tiny-llama", "--lengths", "600,4k", "--out", str(out)]) == 2
    line = error_line(capsys.readouterr().err)
    assert "--lengths 4k: longer than tiny-llama's 2048-token context; pass --yarn FACTOR" in line
    assert not out.exists()
    assert main(["make-data", "needle_qa", "--model", "tiny-llama", "--lengths", "4k", "--yarn", "2", "--n", "1",
                 "--out", str(out)]) == 0
    assert [p.name for p in out.iterdir()] == ["needle_qa_4k.jsonl"]


def test_make_data_checks_every_length_before_writing_any(tmp_path, capsys, error_line):
    out = tmp_path / "data"
    # 600 tokens is fine; 100 tokens cannot hold the question and one document
    assert main(["make-data", "needle_qa", "--model", "tiny-llama", "--lengths", "600,100", "--n", "1",
                 "--out", str(out)]) == 2
    assert "100" in error_line(capsys.readouterr().err)
    assert not out.exists() or not any(out.iterdir())


def test_generate_json_is_alone_on_stdout(monkeypatch, capsys, tiny_of):
    import dysco_interp.models as models

    def load_like_a_real_model(*args, **kwargs):
        print("[dysco-interp] loaded tiny-llama on cpu (torch.float32) in 0.0s")  # what load_model prints
        return tiny_of("llama")

    monkeypatch.setattr(models, "load_model", load_like_a_real_model)
    assert main([*GEN, "--max-new-tokens", "2", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["n_new"] <= 2
    assert "[dysco-interp] loaded" in captured.err


def test_copy_scores_all_zero_write_no_head_file(tmp_path, capsys, error_line):
    out = tmp_path / "heads.json"
    # a random 4-layer model never copies from the gold document
    argv = [*DETECT, "--method", "copy", "--n", "2", "--length", "600", "--max-new-tokens", "4", "--no-progress"]
    assert main([a.replace("{d}", str(tmp_path)) for a in argv]) == 2
    line = error_line(capsys.readouterr().err)
    assert "every copy-paste score is zero on 2 example(s)" in line and "no head file was written" in line
    assert not out.exists() and not list(tmp_path.glob("*heatmap*"))


def test_copy_scores_keep_only_heads_that_scored():
    import torch

    from dysco_interp.cli.detect_heads import informative_top
    from dysco_interp.detection import COPY_PASTE, DetectionResult
    from dysco_interp.errors import NoSignalError

    def result(values):
        scores = torch.tensor(values, dtype=torch.float32).reshape(2, 4)
        return DetectionResult(scores, torch.ones(2, 4, dtype=torch.bool), [scores.double()], ["e0"], COPY_PASTE,
                               "m", 2, 4, 2, "d")

    assert informative_top(result([0, 0.5, 0, 0, 0, 0, 0.25, 0]), 4, "copy") == (2, (
        "only 2 head(s) have a non-zero copy-paste score on 1 example(s); the head file keeps those 2, not 4"))
    assert informative_top(result([1, 2, 3, 4, 5, 6, 7, 8]), 4, "copy") == (4, None)
    assert result([0, 0.5, 0, 0, 0, 0, 0.25, 0]).headset(2).labels() == ["L0H1", "L1H2"]
    with pytest.raises(NoSignalError, match="every copy-paste score is zero"):
        informative_top(result([0] * 8), 4, "copy")


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys, error_line):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(models_command, "run_models", interrupted)
    assert main(["models"]) == 130
    assert error_line(capsys.readouterr().err) == "dysco-interp: interrupted"


def test_ctrl_c_during_evaluate_says_how_to_resume(monkeypatch, files, capsys, error_line):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_command, "run_evaluate", interrupted)
    assert main([a.replace("{d}", str(files)) for a in EVAL]) == 130
    assert error_line(capsys.readouterr().err) == (
        "dysco-interp: interrupted; finished items are kept in --out; the same command resumes")


TORCH_OOM = ("CUDA out of memory. Tried to allocate 208.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which "
             "30.31 MiB is free. Including non-PyTorch memory, this process has 35.51 GiB memory in use. If reserved "
             "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
             "fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html)")


def test_the_device_out_of_memory_is_one_line_saying_what_to_change_and_how_to_resume(monkeypatch, files, capsys,
                                                                                       error_line):
    def out_of_memory(args):
        raise torch.OutOfMemoryError(TORCH_OOM)

    monkeypatch.setattr(evaluate_command, "run_evaluate", out_of_memory)
    assert main([a.replace("{d}", str(files)) for a in EVAL]) == 1
    assert error_line(capsys.readouterr().err) == (
        "dysco-interp: error: the device ran out of memory (CUDA out of memory. Tried to allocate 208.00 MiB. GPU 0 "
        "has a total capacity of 139.80 GiB of which 30.31 MiB is free); a smaller --batch-size, a shorter context "
        "or fewer processes on the device fit; finished items are kept in --out; the same command resumes")
    assert cli_args.out_of_memory(RuntimeError(TORCH_OOM)) is None  # only the allocator's own error


MANY_LINES = ("from dysco_interp.cli import models; "
              "models.run_models = lambda args: [print('x' * 80) for _ in range(10**5)] and 0; ")


@pytest.mark.parametrize("setup", ["", MANY_LINES], ids=["at the final flush", "in the middle of the output"])
def test_a_closed_pipe_prints_nothing(setup):
    # `dysco-interp models | head -0`: the reader is gone before (or while) the output is written
    code = setup + "import sys; from dysco_interp.cli import main; sys.exit(main(['models', '-v']))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert err == ""


def test_every_command_option_says_what_it_does():
    import argparse

    missing = []
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += [f"{name} {a.option_strings or a.dest}" for a in sub._actions
                            if not a.help and a.dest != "help"]
    assert not missing


def test_a_head_file_of_another_model_is_refused_with_the_flag_that_accepts_it(tmp_path, capsys, error_line):
    from dysco_interp.heads import HeadSet
    from dysco_interp.models.tiny import tiny_model

    spec = tiny_model("llama").spec
    path = HeadSet([(1, 0), (2, 1)], model="someone-elses-llama", n_layers=spec.n_layers, n_heads=spec.n_heads,
                   n_kv_heads=spec.n_kv_heads).to_json(tmp_path / "heads.json")
    argv = [*GEN, "--method", "dysco", "--heads", str(path), "--max-new-tokens", "2"]
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err)
    assert "made for model someone-elses-llama" in line and "--allow-other-model" in line
    assert main([*argv, "--allow-other-model"]) == 0


def test_teacher_forcing_needs_room_for_the_gold_answer_only(tmp_path, capsys, error_line):
    data = tmp_path / "data"
    # a prompt near tiny-llama's 2048-token window: 256 free tokens would pass it, the short gold answer does not
    assert main(["make-data", "needle_qa", "--model", "tiny-llama", "--lengths", "1950", "--n", "1",
                 "--out", str(data)]) == 0
    evaluate = ["evaluate", "--task", "needle_qa", "--model", "tiny-llama", "--data", str(data), "--methods", "vanilla",
                "--device", "cpu"]
    assert main([*evaluate, "--out", str(tmp_path / "free.jsonl")]) == 2
    assert "with --max-new-tokens 256 it needs" in error_line(capsys.readouterr().err)
    assert main([*evaluate, "--teacher-forced", "--out", str(tmp_path / "tf.jsonl")]) == 0
    assert (tmp_path / "tf.jsonl").is_file()


@pytest.mark.parametrize("argv,flag", [(["--bogus-flag"], "--bogus-flag"), (["-x", "demo"], "-x")])
def test_an_unknown_flag_before_the_command_is_named(argv, flag, capsys, error_line):
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err)
    assert f"unrecognized arguments: {flag}" in line and "required" not in line
    assert main(["--vers"]) == 0 and capsys.readouterr().out.startswith("dysco-interp ")  # a prefix still works
