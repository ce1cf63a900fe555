"""What a broken or hostile method, option or second writer does to a run: it is refused in one
line, the backends refuse it alike, and nothing finished is lost.

- a bias that leaves softmax undefined (every key -inf, or a finite value so large that the
  scores overflow) is refused on every backend, where a NaN bias already was;
- a record holding NaN never reaches a store;
- options nested beyond reason, layers that are no integers, a name the command line cannot
  select: one line each;
- a method that calls sys.exit mid-decode does not end the run as if it had finished, and one
  that raises says, after its traceback, that the same command resumes;
- a second writer of a store is refused before its model loads.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from dysco_interp import DecodingConfig, SteeringMethod, generate, register_method
from dysco_interp.cli import main
from dysco_interp.decoding import backends
from dysco_interp.decoding.plan import MAX_BIAS, Bias, PassPlan
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.stores.store import ResultStore, StoreError, read_store

PROMPT = "You can travel from Paris to Berlin by train. Rome is quiet. Where can you travel from Paris?"


def biased(model, values: torch.Tensor) -> PassPlan:
    return PassPlan(bias=Bias(range(model.spec.n_layers))).with_bias(values)


@pytest.mark.parametrize("name", backends.BACKENDS)
@pytest.mark.parametrize("fill,words", [
    (float("-inf"), "no finite key"),
    (3e38, "beyond"),
    (-2 * MAX_BIAS, "beyond"),
])
def test_a_bias_that_leaves_softmax_undefined_is_refused_by_every_backend(tiny_llama, name, fill, words):
    rows = 1 if name == "bridge" else 2  # the bridge decodes one prompt at a time
    ids = torch.randint(20, 500, (rows, 12), generator=torch.Generator().manual_seed(5))
    b = backends.make_backend(tiny_llama, name)
    state = b.prefill(ids[:, :-1], None)
    values = torch.zeros(rows, 1, 1, state.n_keys + 1)
    values[-1] = fill  # one row of a batch is enough
    b.run(state, ids[:, -1], biased(tiny_llama, values))
    with pytest.raises(ConfigError, match=words):
        b.check_faults()
    b.check_faults()  # reported once
    # masking keys is fine as long as one stays, and so are large finite biases up to the bound
    values = torch.full((rows, 1, 1, state.n_keys + 1), float("-inf"))
    values[..., -1] = 0.0
    values[..., 0] = MAX_BIAS
    b.run(state, ids[:, -1], biased(tiny_llama, values))
    b.check_faults()


class MasksEverything(SteeringMethod):
    name = "test-masks-everything"
    description = "a bias of -inf on every key, the token's own included"

    def bias(self, selected):
        return torch.full((selected.shape[0], 1, 1, selected.shape[1]), float("-inf"))


@pytest.mark.parametrize("name", backends.BACKENDS)
def test_a_method_whose_bias_masks_every_key_is_refused_alike_on_every_backend(tiny_llama, tiny_heads, name):
    register_method(MasksEverything)
    config = DecodingConfig(method=MasksEverything.name, max_new_tokens=2)
    with pytest.raises(ConfigError, match="no finite key"):
        generate(tiny_llama, PROMPT, config, heads=tiny_heads, backend=name)


@pytest.fixture
def tiny_heads(tiny_llama):
    s = tiny_llama.spec
    return HeadSet([(1, 0), (2, 1)], model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def test_a_record_holding_nan_never_reaches_a_store(tmp_path):
    path = tmp_path / "store.jsonl"
    with ResultStore(path, ("method", "index"), {"x": 1}) as store:
        store.append({"method": "vanilla", "index": 0, "scores": {"accuracy": 1.0}})
        before = path.read_bytes()
        bad = {"method": "mine", "index": 3, "id": "pt-3", "scores": {"accuracy": float("nan")}}
        with pytest.raises(StoreError, match=r"method 'mine' instance 'pt-3' holds scores.accuracy = nan"):
            store.append(bad)
        with pytest.raises(StoreError, match=r"steps\[1\] = inf"):
            store.append({"method": "mine", "index": 4, "steps": [0.5, float("inf")]})
    assert path.read_bytes() == before
    assert len(read_store(path).records) == 1


# ---------------------------------------------------------------------------- options, layers, names


def test_options_nested_beyond_reason_are_one_line(capsys, error_line):
    deep = "[" * 100_000 + "]" * 100_000
    argv = ["evaluate", "--model", "tiny-llama", "--data", "x", "--out", "x.jsonl", "--methods", "vanilla",
            "--method-options", f"vanilla={deep}"]
    assert main(argv) == 2
    assert "nested too deeply" in error_line(capsys.readouterr().err)
    nested: list = []
    for _ in range(2000):  # deep enough for the JSON encoder's recursion, shallow enough to build
        nested = [nested]
    with pytest.warns(DeprecationWarning, match="older spelling of params="):  # options=, for one release
        with pytest.raises(ConfigError, match="nested more than"):
            DecodingConfig(method="test-has-an-option", options={"x": nested})
    with pytest.raises(ConfigError, match="nested more than"):
        DecodingConfig(method="test-has-an-option", params={"x": nested})
    with pytest.raises(ConfigError, match="nested more than"):
        DecodingConfig(method="test-has-an-option").with_params(x=nested)


@register_method
class HasAnOption(SteeringMethod):
    name = "test-has-an-option"
    description = "one option, for the option checks"
    options = {"x": 0}


class Layers(SteeringMethod):
    description = "bias_layers() as a user wrote it"
    layers: list = []

    def bias_layers(self):
        return self.layers


@pytest.mark.parametrize("layers,words", [(["a"], "must be integers"), ([1.7], "must be integers"),
                                          ([True], "must be integers"), ([99], "outside the model")])
def test_bias_layers_that_are_no_layers_of_the_model_are_refused(tiny_llama, tiny_heads, layers, words):
    cls = register_method(type(f"Layers{len(words)}{layers!r}", (Layers,), {
        "name": f"test-layers-{abs(hash(repr(layers)))}", "layers": layers}))
    with pytest.raises(ConfigError, match=f"method '{cls.name}'.*{words}"):
        generate(tiny_llama, PROMPT, DecodingConfig(method=cls.name, max_new_tokens=1), heads=tiny_heads)


@pytest.mark.parametrize("name", ["two words", "line\nbreak", "quote'd", "comma,name", "", "tab\tname", "é"])
def test_a_method_name_the_command_line_cannot_select_is_refused(name):
    with pytest.raises(ConfigError, match="letters, digits"):
        register_method(type("Named", (SteeringMethod,), {"name": name, "description": "x"}))


@pytest.mark.parametrize("command", ["generate", "evaluate"])
def test_the_help_says_a_methods_file_runs_as_code(command, capsys):
    assert main([command, "--help"]) == 0
    assert "runs as Python code" in " ".join(capsys.readouterr().out.split())


# ---------------------------------------------------------------------------- mid-run


EXITS = '''
import sys
import torch
from dysco_interp import SteeringMethod, register_method

@register_method
class Leaves(SteeringMethod):
    name = "test-leaves-{code}"
    description = "ends the process on its third step"
    step_shape = "bias-only"
    steps = 0

    def start(self, model, batch):
        self.rows, self.device = batch.ids.shape[0], model.device

    def select(self, relevance, n_keys):
        return torch.zeros(self.rows, n_keys, dtype=torch.bool, device=self.device)

    def bias(self, selected):
        type(self).steps += 1
        if type(self).steps > {after}:
            {action}
        return torch.zeros(selected.shape[0], 1, 1, selected.shape[1])
'''




@pytest.mark.parametrize("action,code,words", [
    ("sys.exit(0)", 2, "called sys.exit(0) while decoding"),
    ("raise RuntimeError('a bug of mine')", 1, "stopped by the error above"),
])
def test_a_method_that_stops_mid_decode_ends_in_an_error_and_keeps_what_finished(
        data_dir, tmp_path, capsys, action, code, words):
    file = tmp_path / f"leaves_{code}.py"
    file.write_text(textwrap.dedent(EXITS.format(after=6, action=action, code=code)))
    out = tmp_path / "results.jsonl"
    argv = ["evaluate", "--model", "tiny-llama", "--data", str(data_dir), "--out", str(out), "--methods-from",
            str(file), "--methods", f"vanilla,test-leaves-{code}", "--max-new-tokens", "4"]
    assert main(argv) == code
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert words in last and "finished items are kept in --out; the same command resumes" in last
    if code == 1:
        assert "Traceback" in err and "a bug of mine" in err  # what the researcher needs to fix it
    methods = [r["method"] for r in read_store(out).records]
    assert methods == ["vanilla"]  # the finished method's records are kept


def test_a_second_writer_is_refused_before_its_model_loads(data_dir, tmp_path, capsys, no_weights, error_line):
    out = tmp_path / "results.jsonl"
    with ResultStore(out, ("method", "instance"), {"anything": 1}, purpose="evaluate"):
        argv = ["evaluate", "--model", "tiny-llama", "--data", str(data_dir), "--out", str(out),
                "--methods", "vanilla", "--max-new-tokens", "2"]
        assert main(argv) == 2
        assert "being written by another writer" in error_line(capsys.readouterr().err)
        assert main([*argv, "--if-settings-differ", "new"]) == 2
        assert "being written by another writer" in error_line(capsys.readouterr().err)
    assert json.loads(out.read_text().splitlines()[0])["settings"] == {"anything": 1}
