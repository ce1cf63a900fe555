"""A researcher's own methods on the command line: `--methods-from FILE.py` registers them for
`generate` and `evaluate`, `--method-options NAME=JSON` sets their options, the store records and
guards those options, and every mistake is one line before any model loads."""

import json
import sys
import textwrap

import pytest

from dysco_interp.analysis.method_key import method_key
from dysco_interp.cli import main
from dysco_interp.cli.app import build_parser
from dysco_interp.cli.user_methods import load_method_file, module_name
from dysco_interp.heads import HeadSet
from dysco_interp.stores.store import read_store

NAMES = ("cli-above-qrheads", "cli-pasta")
HELPER = "cli_user_method_helpers"
# the two methods of docs/guide/methods.md, as a user's file: the second imports a helper beside it
METHODS_FILE = f'''
import torch

from dysco_interp import SteeringMethod, register_method
from {HELPER} import log_alpha


@register_method
class AboveQRHeads(SteeringMethod):
    name = "cli-above-qrheads"
    description = "DySCO's bias in the layers after the deepest QRHead only, in two passes"

    def bias_layers(self):
        return range(max(layer for layer, _ in self.heads) + 1, self.spec.n_layers)


@register_method
class Pasta(SteeringMethod):
    name = "cli-pasta"
    description = "PASTA-like: attention outside the prompt's last tokens scaled by alpha in chosen heads"
    step_shape = "bias-only"
    fields = frozenset({{"schedule"}})
    options = {{"alpha": 0.01, "heads": [[1, 0], [2, 3]], "tail": 16}}

    def bias_heads(self):
        return [tuple(pair) for pair in self.option("heads")]

    def start(self, model, batch):
        outside = torch.zeros(batch.ids.shape, dtype=torch.bool)
        for row, (prepared, pad) in enumerate(zip(batch.prepared, batch.pads)):
            outside[row, pad:pad + len(prepared.ids) - self.option("tail")] = True
        self.outside = outside.to(model.device)

    def select(self, relevance, n_keys):
        return torch.nn.functional.pad(self.outside, (0, n_keys - self.outside.shape[-1]))[:, :n_keys]

    def bias(self, selected):
        return torch.where(selected, log_alpha(self.option("alpha")), 0.0)[:, None, None, :].float()
'''
DEFAULT_OPTIONS = {"alpha": 0.01, "heads": [[1, 0], [2, 3]], "tail": 16}


@pytest.fixture(scope="module")
def methods_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user")
    (folder / f"{HELPER}.py").write_text("import math\n\n\ndef log_alpha(alpha):\n    return math.log(alpha)\n")
    path = folder / "my_methods.py"
    path.write_text(METHODS_FILE)
    yield path
    # the registry is the process's: leave it as the other tests expect it
    from dysco_interp.decoding import methods

    for name in NAMES:
        methods.REGISTRY.pop(name, None)
        methods.METHODS.pop(name, None)
    for module in (module_name(path.resolve()), HELPER):
        sys.modules.pop(module, None)


@pytest.fixture(scope="module")
def head_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("heads") / "h.json"
    HeadSet([(1, 0), (2, 3)], model="tiny-llama", n_layers=4, n_heads=4, n_kv_heads=2).to_json(path)
    return path


def evaluate_argv(data, out, methods_file, head_file, alpha):
    return ["evaluate", "--model", "tiny-llama", "--data", str(data), "--out", str(out), "--max-new-tokens", "4",
            "--methods", "vanilla,cli-pasta,cli-above-qrheads", "--methods-from", str(methods_file),
            "--method-options", f'cli-pasta={{"alpha": {alpha}}}', "--heads", str(head_file), "--device", "cpu"]


def test_evaluate_records_a_users_method_with_its_options_and_refuses_others(data_dir, methods_file, head_file,
                                                                             tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.jsonl"
    assert main(evaluate_argv(data_dir, out, methods_file, head_file, 0.05)) == 0
    printed = capsys.readouterr().out
    rows = [line.split()[:2] for line in printed.splitlines()]
    assert ["1950", "cli-pasta"] in rows and ["1950", "cli-above-qrheads"] in rows and ["1950", "vanilla"] in rows
    by_method = {r["method"]: r for r in read_store(out).records}
    assert set(by_method) == {"vanilla", *NAMES}
    options = {**DEFAULT_OPTIONS, "alpha": 0.05}
    assert by_method["cli-pasta"]["settings"]["method"]["options"] == options
    assert by_method["cli-pasta"]["config"]["options"] == options
    # a method without options records none, as the built-in ones (older stores stay comparable)
    assert "options" not in by_method["cli-above-qrheads"]["settings"]["method"]
    assert by_method["cli-above-qrheads"]["settings"]["method"]["heads"] == [[1, 0], [2, 3]]
    assert method_key(by_method["cli-pasta"]).label == "cli-pasta (alpha=0.05)"
    before = out.read_bytes()

    import dysco_interp.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    assert main(evaluate_argv(data_dir, out, methods_file, head_file, 0.2)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dysco-interp: error:") and "\n" not in err, err
    assert "'cli-pasta'" in err and "options.alpha 0.05 -> 0.2" in err
    assert out.read_bytes() == before
    monkeypatch.undo()
    # the same options resume: nothing is left to decode
    assert main(evaluate_argv(data_dir, out, methods_file, head_file, 0.05)) == 0
    assert "(0 new records" in capsys.readouterr().out and out.read_bytes() == before


def test_generate_runs_a_users_method_with_its_options(methods_file, capsys):
    argv = ["generate", "--model", "tiny-llama", "--prompt", "hello there, how are you today? " * 3,
            "--max-new-tokens", "3", "--device", "cpu", "--methods-from", str(methods_file), "--method", "cli-pasta",
            "--method-options", 'cli-pasta={"alpha": 0.5, "tail": 4}']
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["method"] == "cli-pasta" and result["options"] == {**DEFAULT_OPTIONS, "alpha": 0.5, "tail": 4}
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "[cli-pasta, options {" in printed and "cli-pasta selected" in printed and "DySCO" not in printed


def test_a_file_loads_again_as_the_same_module_and_leaves_sys_path_as_it_was(methods_file):
    path = list(sys.path)
    name = load_method_file(str(methods_file))
    assert load_method_file(str(methods_file)) == name  # a second run in one process registers the same classes
    assert sys.path == path
    from dysco_interp.decoding.methods import REGISTRY

    assert {REGISTRY[n].__module__ for n in NAMES} == {name}


def test_help_documents_both_flags():
    commands = {a.dest: a for a in build_parser()._actions if a.dest == "command"}["command"].choices
    for command in ("generate", "evaluate"):
        text = " ".join(commands[command].format_help().split())
        assert "--methods-from FILE.py" in text and "--method-options NAME=JSON" in text
        assert "register_method" in text and "alpha" in text


FILES = {
    "raises.py": "import math\n\nx = 1 / 0\n",
    "syntax.py": "def broken(:\n    pass\n",
    "notes.txt": "not python\n",
    "takes_dysco.py": textwrap.dedent('''
        from dysco_interp import SteeringMethod, register_method


        @register_method
        class Mine(SteeringMethod):
            name = "dysco"
            description = "a name that is taken"
    '''),
}
GEN = ["generate", "--model", "tiny-llama", "--prompt", "hi"]
EVAL = ["evaluate", "--model", "tiny-llama", "--data", "{d}", "--out", "{d}/r.jsonl"]
FROM = ["--methods-from", "{f}"]
CASES = {
    "file missing": ([*GEN, "--methods-from", "{d}/missing.py"],
                     "dysco-interp generate: error: argument --methods-from: {d}/missing.py: no such file"),
    "file is a folder": ([*EVAL, "--methods-from", "{d}"], "argument --methods-from: {d} is a folder; name a Python"),
    "file not .py": ([*GEN, "--methods-from", "{d}/notes.txt"], "{d}/notes.txt is not a Python file (.py)"),
    "file raises": ([*GEN, "--methods-from", "{d}/raises.py"],
                    "{d}/raises.py: importing it raised ZeroDivisionError at line 3: division by zero"),
    "file has a syntax error": ([*EVAL, "--methods-from", "{d}/syntax.py"],
                                "{d}/syntax.py: importing it raised SyntaxError at line 1"),
    "file takes a built-in name": ([*GEN, "--methods-from", "{d}/takes_dysco.py"],
                                   "importing it raised ConfigError at line 5: method 'dysco' is already registered"),
    "unknown method": ([*GEN, "--method", "my-pasta"],
                       ("argument --method: unknown method(s) my-pasta; choose from vanilla, uniattns, dysco, "
                        "dysco-static, dysco-random, dysco-reuse",  # and any registered in this process
                        "(or a method of your own: --methods-from FILE.py registers it)")),
    "unknown method after a file": ([*EVAL, *FROM, "--methods", "vanilla,cli-pastaa"],
                                    "dysco-interp evaluate: error: argument --methods: unknown method(s) cli-pastaa; "
                                    "choose from vanilla, uniattns, dysco, dysco-static, dysco-random, dysco-reuse, "),
    "unknown option": ([*GEN, *FROM, "--method", "cli-pasta", "--method-options", 'cli-pasta={"alfa": 1}'],
                       "argument --params: method 'cli-pasta' has no parameter 'alfa' "
                       "(its parameters: alpha, heads, schedule, tail)"),
    "options of a built-in method": ([*EVAL, "--methods", "dysco", "--method-options", 'dysco={"alpha": 1}'],
                                     "method 'dysco' has no parameter 'alpha' (its parameters: beta, decay, "
                                     "k_fraction, schedule, select_k, select_p, template_masking)"),
    "options of a method not run": ([*EVAL, *FROM, "--methods", "vanilla", "--method-options", "cli-pasta={}"],
                                    "argument --params: cli-pasta is not a method this run uses "
                                    "(--methods vanilla)"),
    "options twice": ([*GEN, *FROM, "--method", "cli-pasta", "--method-options", 'cli-pasta={"alpha": 1}',
                       "--method-options", 'cli-pasta={"tail": 2}'], "cli-pasta is given twice; name all its options"),
    "options not JSON": ([*GEN, "--method-options", "cli-pasta={alpha: 1}"],
                         "argument --params/--method-options: cli-pasta=...: not valid JSON ("),
    "options not an object": ([*GEN, "--method-options", "cli-pasta=[1]"], "the options must be a JSON object"),
    "options without a name": ([*GEN, "--method-options", '{"alpha": 1}'], "is not NAME=JSON"),
    "option not JSON-able": ([*GEN, *FROM, "--method", "cli-pasta", "--method-options", 'cli-pasta={"alpha": NaN}'],
                             "parameter 'alpha' of method 'cli-pasta' must be a JSON value"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_before_any_model_load(case, methods_file, data_dir, tmp_path, no_model, capsys,
                                                     error_line):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    argv, expected = CASES[case]
    for file in data_dir.glob("*.jsonl"):  # evaluate's data, beside the store it must not write
        (tmp_path / file.name).write_bytes(file.read_bytes())

    def filled(text: str) -> str:  # str.format would read the JSON's braces
        return text.replace("{d}", str(tmp_path)).replace("{f}", str(methods_file))

    assert main([filled(a) for a in argv]) == 2
    line = error_line(capsys.readouterr().err)
    for part in (expected,) if isinstance(expected, str) else expected:
        assert filled(part) in line, line
    assert not (tmp_path / "r.jsonl").exists()
