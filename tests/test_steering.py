"""Researchers' own methods over the pass-plan contract: defined in user code, registered by name,
run on every backend, in batches, and checked against what they should equal."""

import math

import pytest
import torch

from dysco_interp import DecodingConfig, SteeringMethod, generate, generate_batch, observe, register_method
from dysco_interp.decoding import methods
from dysco_interp.decoding.backends import BackendSpec
from dysco_interp.decoding.methods import SelectionParams
from dysco_interp.decoding.passes import current_pass
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import layer_of, scores_name
from dysco_interp.models.tiny import STYLES, tiny_model

PROMPT = "You can travel from Paris to Berlin by train. Rome is quiet. " * 5 + "Give a route from Paris to Berlin."
OTHER = "Oslo has a harbour. Rome is quiet. Bergen is rainy. " * 3 + "Which city has a harbour?"
N_NEW = 10
BACKENDS = ("bridge", "sdpa", "static")


class AboveQRHeads(SteeringMethod):
    """DySCO's selection and bias, but only in the layers after the deepest QRHead, in two passes."""

    name = "test-above-qrheads"
    description = "DySCO's bias in the layers after the deepest QRHead only (two passes)"

    def bias_layers(self):
        return range(max(layer for layer, _ in self.heads) + 1, self.spec.n_layers)


class Pasta(SteeringMethod):
    """PASTA at decoding time: in the chosen heads, every prompt key outside the marked spans gets
    log(alpha), i.e. its attention weight times alpha before renormalising ("exclude" scaling)."""

    name = "test-pasta"
    description = "PASTA: attention outside the emphasised spans scaled by alpha in chosen heads"
    step_shape = "bias-only"
    fields = frozenset({"schedule"})
    options = {"alpha": 0.01, "heads": [[1, 0], [2, 3], [3, 1]], "emphasize": ["Rome is quiet."]}

    def bias_heads(self):
        return [tuple(pair) for pair in self.option("heads")]

    def start(self, model, batch):
        self.outside = torch.zeros(batch.ids.shape, dtype=torch.bool)
        for row, (prepared, pad) in enumerate(zip(batch.prepared, batch.pads)):
            self.outside[row, pad:pad + len(prepared.ids)] = True
            for needle in self.option("emphasize"):
                at = prepared.text.find(needle)
                if at < 0:
                    raise ConfigError(f"{needle!r} is not in prompt {row}")
                start, end = prepared.encoded.token_span(at, at + len(needle))
                self.outside[row, pad + start:pad + end] = False
        self.outside = self.outside.to(model.device)

    def select(self, relevance, n_keys):
        return torch.nn.functional.pad(self.outside, (0, n_keys - self.outside.shape[-1]))[:, :n_keys]

    def bias(self, selected):
        return torch.where(selected, math.log(self.option("alpha")), 0.0)[:, None, None, :].float()


for cls in (AboveQRHeads, Pasta):
    register_method(cls)


def heads_for(model, pairs=((1, 0), (2, 3), (1, 2))):
    s = model.spec
    return HeadSet(list(pairs), model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


STRONG = SelectionParams(beta=4.0, select_p=0.7)


def configs():
    return {"reuse": DecodingConfig(method="dysco-reuse", params=STRONG, max_new_tokens=N_NEW),
            "above": DecodingConfig(method=AboveQRHeads.name, params=STRONG, max_new_tokens=N_NEW),
            "pasta": DecodingConfig(method=Pasta.name, max_new_tokens=N_NEW)}


@pytest.mark.parametrize("style", STYLES)
def test_a_users_two_pass_method_gives_dysco_reuse_s_tokens_on_every_backend_and_in_batches(style):
    model = tiny_model(style)
    heads = heads_for(model)
    out = {b: generate_batch(model, [PROMPT, OTHER] if b != "bridge" else [PROMPT], configs(), heads, backend=b)
           for b in BACKENDS}
    for backend, results in out.items():
        for reuse, above in zip(results["reuse"], results["above"]):
            assert above.tokens == reuse.tokens, backend
            assert [s.n_selected for s in above.trace.steps] == [s.n_selected for s in reuse.trace.steps]
        assert results["pasta"][0].tokens == out["bridge"]["pasta"][0].tokens, backend
        assert results["above"][0].tokens == out["bridge"]["above"][0].tokens, backend
    # a batch gives each row what it gets alone
    alone = generate_batch(model, [OTHER], configs(), heads, backend="sdpa")
    for name in configs():
        assert out["sdpa"][name][1].tokens == alone[name][0].tokens, name


class GradedTopK(SteeringMethod):
    """Its own top-4 over the relevance, never on a pad or a template token (the public mask), and a
    bias graded by that relevance: log(1 + 8 r) on the chosen keys."""

    name = "test-graded-top-k"
    description = "own top-k outside never_selected, bias graded by relevance"

    def select(self, relevance, n_keys):
        never = self.never_selected[:, :n_keys]
        scores = relevance.masked_fill(never, -1.0)
        chosen = torch.zeros_like(never)
        chosen.scatter_(1, scores.topk(4, dim=-1).indices, True)
        return chosen & ~never

    def bias(self, selected, relevance):
        return torch.where(selected, torch.log1p(8 * relevance), 0.0)[:, None, None, :].float()


register_method(GradedTopK)


@pytest.mark.parametrize("style", ["llama", "gemma3"])
def test_a_graded_bias_and_an_own_top_k_outside_the_public_mask_run_on_every_backend(style):
    model = tiny_model(style)
    config = DecodingConfig(method=GradedTopK.name, params={"template_masking": "skeleton"}, record_positions=True,
                            max_new_tokens=N_NEW)
    out = {b: generate_batch(model, [PROMPT, OTHER] if b != "bridge" else [PROMPT], {"g": config},
                             heads_for(model), backend=b)["g"] for b in BACKENDS}
    plain = generate(model, PROMPT, DecodingConfig(method="vanilla", max_new_tokens=N_NEW))
    assert out["bridge"][0].tokens != plain.tokens  # the graded bias changes the output
    for backend in ("sdpa", "static"):
        assert out[backend][0].tokens == out["bridge"][0].tokens, backend
    # the batch's second row is left-padded; no selection of either row lands on a pad or a template token
    from dysco_interp.decoding.prompts import prepare_prompt

    template = prepare_prompt(model, OTHER).template("skeleton").tolist()
    chosen = [step.selected for step in out["sdpa"][1].trace.steps if step.selected is not None]
    assert chosen and all(len(keys) == 4 for keys in chosen)
    for keys in chosen:
        assert min(keys) >= 0 and not any(template[k] for k in keys if k < len(template))


def direct_pasta(model, alpha, heads, emphasized_span, n_prompt):
    """PASTA written directly as a TransformerLens hook on the bridge, in the same passes."""
    log_alpha = math.log(alpha)
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)

    def hook(scores, hook):
        p = current_pass()
        if p is None or p.kind != "biased":
            return scores
        outside = torch.zeros(scores.shape[-1], dtype=torch.bool)
        outside[:n_prompt] = True
        outside[emphasized_span[0]:emphasized_span[1]] = False
        scores = scores.float().clone()
        for head in by_layer[layer_of(hook)]:
            scores[:, head, :, outside] += log_alpha
        return scores

    return [(scores_name(layer), hook) for layer in by_layer]


def test_pasta_as_a_plan_equals_pasta_written_as_bridge_hooks(tiny_llama):
    from dysco_interp.decoding.prompts import prepare_prompt

    prepared = prepare_prompt(tiny_llama, PROMPT)
    at = prepared.text.find("Rome is quiet.")
    span = prepared.encoded.token_span(at, at + len("Rome is quiet."))
    config = DecodingConfig(method=Pasta.name, max_new_tokens=N_NEW, params={"alpha": 0.05})
    ours = generate(tiny_llama, PROMPT, config)
    # the direct version rides on a method whose biased passes add nothing (beta 1 selects and adds log 1)
    hooks = direct_pasta(tiny_llama, 0.05, Pasta.options["heads"], span, len(prepared.ids))
    with observe(tiny_llama, hooks=hooks):
        direct = generate(tiny_llama, PROMPT,
                          DecodingConfig(method=AboveQRHeads.name, params={"beta": 1.0}, max_new_tokens=N_NEW),
                          heads=heads_for(tiny_llama))
    plain = generate(tiny_llama, PROMPT, DecodingConfig(method="vanilla", max_new_tokens=N_NEW))
    assert ours.tokens == direct.tokens
    assert ours.tokens != plain.tokens  # alpha 0.05 changes the output, so equality means something


class Broken(SteeringMethod):
    name = "test-broken"
    description = "a bias rule that returns NaN"

    def bias(self, selected):
        return torch.full((selected.shape[0], 1, 1, selected.shape[1]), float("nan"))


def test_a_user_method_is_refused_in_one_line_when_it_cannot_run(tiny_llama):
    heads = heads_for(tiny_llama)

    class Outside(Pasta):
        name = "test-outside"
        options = {**Pasta.options, "heads": [[99, 0]]}

    register_method(Broken)
    register_method(Outside)
    with pytest.raises(ConfigError, match="NaN"):
        generate(tiny_llama, PROMPT, DecodingConfig(method="test-broken", max_new_tokens=2), heads=heads)
    with pytest.raises(ConfigError, match="outside the model"):
        generate(tiny_llama, PROMPT, DecodingConfig(method="test-outside", max_new_tokens=2))
    with pytest.raises(ConfigError, match="has no parameter 'beta'"):
        DecodingConfig(method=Pasta.name, params={"beta": 2})
    with pytest.raises(ConfigError, match="already registered"):
        register_method(type("Other", (SteeringMethod,), {"name": Pasta.name, "description": "x"}))
    with pytest.raises(ConfigError, match="fields that are no method's"):
        register_method(type("Wrong", (SteeringMethod,), {"name": "test-wrong", "description": "x",
                                                         "fields": frozenset({"max_new_tokens"})}))


def test_a_user_method_s_options_are_recorded_with_its_results():
    config = DecodingConfig(method=Pasta.name, params={"alpha": 0.5})
    used = config.used_fields()
    assert used["options"] == {"alpha": 0.5, "emphasize": ("Rome is quiet.",), "heads": ((1, 0), (2, 3), (3, 1))}
    assert "beta" not in used and "options" not in DecodingConfig(method="dysco").used_fields()
    assert config != DecodingConfig(method=Pasta.name, params={"alpha": 0.25})
    assert methods.REGISTRY[Pasta.name] is Pasta


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("style", STYLES)
def test_user_methods_replay_as_cuda_graphs_with_the_eager_tokens(style):
    model = tiny_model(style, device="cuda")
    heads = heads_for(model)
    replayed = generate_batch(model, [PROMPT, OTHER], configs(), heads, backend=BackendSpec("static", graphs=True))
    eager = generate_batch(model, [PROMPT, OTHER], configs(), heads, backend=BackendSpec("static", graphs=False))
    for name in configs():
        for ours, ref in zip(replayed[name], eager[name]):
            assert ours.tokens == ref.tokens, name
    for ours, ref in zip(replayed["above"], replayed["reuse"]):
        assert ours.tokens == ref.tokens


def test_a_method_that_cannot_run_writes_nothing_to_the_store(tiny_llama, tmp_path):
    from dysco_interp import evaluate, make_dataset
    from dysco_interp.stores.store import ResultStore

    register_method(Broken)
    instances = make_dataset("path_traversal", tiny_llama.tokenizer, 1950, n=2, seed=0)
    configs = {"broken": DecodingConfig(method=Broken.name, max_new_tokens=2)}
    for backend in ("bridge", "sdpa", "static"):
        out = tmp_path / f"{backend}.jsonl"
        with pytest.raises(ConfigError, match="NaN"):
            evaluate(tiny_llama, "tiny-llama", "path_traversal", instances, configs, heads_for(tiny_llama), out,
                     backend=backend, batch_size=1 if backend == "bridge" else 2, progress=False)
        assert not out.exists() or not list(ResultStore(out, ("method", "instance"), readonly=True).records())


class OldStep(methods.Dysco):
    """A method written against the old step(run, n_keys, selector): it still runs, with a notice."""

    name = "test-old-step"
    description = "DySCO with the old step signature"

    def step(self, run, n_keys, selector):
        assert selector is self.selector
        return super().step(run, n_keys)


def test_a_method_with_the_old_step_signature_runs_for_one_release_with_a_notice(tiny_llama):
    register_method(OldStep)
    try:
        config = DecodingConfig(method=OldStep.name, params=STRONG, max_new_tokens=N_NEW)
        with pytest.warns(DeprecationWarning, match="step"):
            old = generate(tiny_llama, PROMPT, config, heads=heads_for(tiny_llama))
        new = generate(tiny_llama, PROMPT, config.replace(method="dysco"), heads=heads_for(tiny_llama))
        assert old.tokens == new.tokens
    finally:
        methods.REGISTRY.pop(OldStep.name, None)
        methods.METHODS.pop(OldStep.name, None)


def test_the_older_passes_declaration_runs_for_one_release_with_a_notice(tiny_llama):
    with pytest.warns(DeprecationWarning, match="passes = 'one' is deprecated .* step_shape = 'read-while-biasing'"
                      ) as caught:
        class OldReuse(AboveQRHeads):
            name = "test-old-reuse"
            passes = "one"

    # one line, pointing at the class that declares it
    assert len(caught) == 1 and "\n" not in str(caught[0].message) and caught[0].filename == __file__

    class Reuse(AboveQRHeads):
        name = "test-reuse"
        step_shape = "read-while-biasing"

    assert OldReuse.step_shape == Reuse.step_shape and OldReuse.uses_heads

    class Later(OldReuse):  # inherits the shape, with no notice of its own
        name = "test-later"

    assert Later.step_shape == "read-while-biasing"
    with pytest.warns(DeprecationWarning, match="step_shape = 'bias-only'"):
        class OldPasta(Pasta):
            passes = "none"
    assert OldPasta.step_shape == "bias-only" and not OldPasta.uses_heads
    with pytest.raises(ConfigError, match="not 'three'"):
        type("Three", (SteeringMethod,), {"passes": "three"})
    with pytest.raises(ConfigError, match="both passes and step_shape"):
        type("Both", (SteeringMethod,), {"passes": "two", "step_shape": "read-then-bias"})
    with pytest.raises(ConfigError, match="step_shape is 'read-then-bias', 'read-while-biasing', 'bias-only'"):
        type("Wrong", (SteeringMethod,), {"step_shape": "two"})(DecodingConfig(), None, tiny_llama.spec)

    # read then biased in the same pass, the bias after the deepest read: dysco-reuse's tokens
    for cls in (OldReuse, Reuse):
        register_method(cls)
    try:
        config = DecodingConfig(method="dysco-reuse", params=STRONG, max_new_tokens=N_NEW)
        out = {name: generate(tiny_llama, PROMPT, config.replace(method=name), heads=heads_for(tiny_llama)).tokens
               for name in ("dysco-reuse", OldReuse.name, Reuse.name)}
        assert out[OldReuse.name] == out[Reuse.name] == out["dysco-reuse"]
    finally:
        for cls in (OldReuse, Reuse):
            methods.REGISTRY.pop(cls.name, None)
            methods.METHODS.pop(cls.name, None)


def test_a_method_keeps_values_of_its_own_in_each_step_of_the_trace(tiny_llama):
    from dysco_interp.decoding.results import Trace

    gated = generate(tiny_llama, PROMPT, DecodingConfig(method="dysco-gated", max_new_tokens=N_NEW,
                                                        params={"beta": 4.0, "select_p": 0.7, "min_mass": 0.5}),
                     heads=heads_for(tiny_llama))
    steps = [s for s in gated.trace.steps if s.n_selected is not None]
    assert steps and all(set(s.own) == {"scaled"} for s in steps)
    assert all(s.own["scaled"] == (s.n_selected > 0) for s in steps)  # the gate and the selection agree
    again = Trace.from_dict(gated.trace.to_dict())
    assert [s.own for s in again.steps] == [s.own for s in gated.trace.steps]
    plain = generate(tiny_llama, PROMPT, DecodingConfig(method="vanilla", max_new_tokens=N_NEW))
    assert all(s.own is None for s in plain.trace.steps)
    assert all("own" not in s for s in plain.trace.to_dict()["steps"])  # traces of other methods read as before
