"""PASTA as a plan program and its head profiling: the same tokens on bridge, sdpa and static, in a
padded batch as alone; the tokens of PASTA written directly as TransformerLens hooks on the
bridge; vanilla's tokens at alpha = 1; bad parameters refused in one line before any model
loads; and the one-pass-per-head profile equal to teacher-forced decoding of pasta with that head."""

import math
import re

import pytest
import torch

import dysco_interp.decoding.baselines.pasta  # noqa: F401  (registers the method)
from dysco_interp import DecodingConfig, generate, generate_batch, observe
from dysco_interp.decoding.baselines.pasta import Pasta, emphasized_keys, parse_heads
from dysco_interp.decoding.baselines.pasta_profile import profile_heads, top_heads
from dysco_interp.decoding.methods import REGISTRY
from dysco_interp.decoding.passes import current_pass
from dysco_interp.decoding.prompts import prepare_prompt
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import layer_of, scores_name
from dysco_interp.models.tiny import STYLES

SPAN = "Rome is quiet."
PROMPT = "Answer with one short line. " + f"You can travel from Paris to Berlin by train. {SPAN} " * 4 + \
    "Give a route from Paris to Berlin."
OTHER = "Answer with one short line. " + f"Oslo has a harbour. {SPAN} Bergen is rainy. " * 2 + \
    "Which city has a harbour?"
GOLDS = ["Take the train from Paris to Berlin.", "Oslo."]
N_NEW = 8
HEADS = "L0H1 L1H0 L2H3 L3H1"
ALPHA = 0.01


def configs(alpha: float = ALPHA, heads: str = HEADS) -> dict[str, DecodingConfig]:
    """The span by its text, the last message (the default), and vanilla."""
    return {"text": DecodingConfig(method="pasta", params={"alpha": alpha, "heads": heads, "emphasize": [SPAN]},
                                   max_new_tokens=N_NEW),
            "message": DecodingConfig(method="pasta", params={"alpha": alpha, "heads": heads}, max_new_tokens=N_NEW),
            "vanilla": DecodingConfig(method="vanilla", max_new_tokens=N_NEW)}


@pytest.mark.parametrize("style", STYLES)
def test_pasta_gives_the_same_tokens_on_every_backend_in_a_padded_batch_as_alone(style, tiny_of, tokens_everywhere):
    model = tiny_of(style)
    assert len(prepare_prompt(model, PROMPT).ids) != len(prepare_prompt(model, OTHER).ids)  # the batch is padded
    out = tokens_everywhere(model, configs(), (PROMPT, OTHER))
    for backend in ("sdpa", "static"):
        assert out[backend] == out["bridge"], backend
    for name in ("text", "message"):  # the steering changes the output, so equality means something
        assert out["bridge"][name] != out["bridge"]["vanilla"], name


def test_alpha_1_gives_vanilla_s_tokens_on_every_backend(tiny_llama, tokens_everywhere):
    out = tokens_everywhere(tiny_llama, configs(alpha=1.0), (PROMPT, OTHER))
    for backend, tokens in out.items():
        assert tokens["text"] == tokens["message"] == tokens["vanilla"], backend


def direct_pasta(model, alpha: float, heads: list[tuple[int, int]], outside: list[int]):
    """PASTA written directly as TransformerLens hooks: log(alpha) on the scores of the keys
    `outside` in the chosen heads only, in the passes of the steps the schedule runs as the
    method's own (the last prompt tokens and the generated ones)."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)

    def hook(scores, hook):
        p = current_pass()
        if p is None or p.phase not in ("intervention-warmup", "decode"):
            return scores
        # the layer's key axis ends at this token's own key (a sliding window holds only the last keys)
        n_keys, width = p.position + 1, scores.shape[-1]
        columns = [k - (n_keys - width) for k in outside if n_keys - width <= k < n_keys]
        out = scores.float().clone()
        for head in by_layer[layer_of(hook)]:
            out[:, head, :, columns] += math.log(alpha)
        return out

    return [(scores_name(layer), hook) for layer in by_layer]


def outside_of(model, prompt: str, span: str) -> list[int]:
    """The prompt tokens that do not overlap any occurrence of `span`, from the tokenizer's own
    offsets of the rendered chat."""
    text = prepare_prompt(model, prompt).text
    encoded = model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = [(m.start(), m.end()) for m in re.finditer(re.escape(span), text)]
    return [i for i, (a, b) in enumerate(encoded["offset_mapping"]) if not any(a < e and b > s for s, e in spans)]


def plan_and_hooks(model, heads: str, n_new: int = N_NEW) -> tuple[list[int], list[int], list[int]]:
    """The tokens of pasta as a plan, of PASTA as bridge hooks, and of vanilla decoding."""
    ours = generate(model, PROMPT, configs(heads=heads)["text"].replace(max_new_tokens=n_new), backend="bridge").tokens
    vanilla = DecodingConfig(method="vanilla", max_new_tokens=n_new)
    with observe(model, hooks=direct_pasta(model, ALPHA, list(parse_heads(heads)), outside_of(model, PROMPT, SPAN))):
        direct = generate(model, PROMPT, vanilla, backend="bridge").tokens
    return ours, direct, generate(model, PROMPT, vanilla, backend="bridge").tokens


@pytest.mark.parametrize("style", ["llama", "gemma3"])
def test_pasta_as_a_plan_equals_pasta_written_as_bridge_hooks(style, tiny_of):
    ours, direct, vanilla = plan_and_hooks(tiny_of(style), HEADS)
    assert ours == direct
    assert ours != vanilla


@pytest.mark.real_model
def test_pasta_as_a_plan_equals_bridge_hooks_on_the_default_model(real_model):
    # every head of the middle layers: enough steering that the default model's tokens move
    heads = " ".join(f"L{layer}H{head}" for layer in range(8, 20) for head in range(real_model.spec.n_heads))
    ours, direct, vanilla = plan_and_hooks(real_model, heads, n_new=12)
    assert ours == direct
    assert ours != vanilla


def test_the_emphasised_keys_are_every_occurrence_or_the_last_message(tiny_llama):
    prepared = prepare_prompt(tiny_llama, PROMPT)
    by_text = emphasized_keys(prepared, (SPAN,))
    runs = [len(run) for run in "".join("x" if k else " " for k in by_text.tolist()).split()]
    assert len(runs) == 4  # every occurrence
    assert (~by_text).nonzero().flatten().tolist() == outside_of(tiny_llama, PROMPT, SPAN)
    message = emphasized_keys(prepared, ())
    assert (~message).nonzero().flatten().tolist() == outside_of(tiny_llama, PROMPT, PROMPT)
    assert Pasta.Params(emphasize=SPAN).emphasize == (SPAN,)
    assert parse_heads("L2H3, L1H0  L2H3") == ((1, 0), (2, 3))


@pytest.mark.parametrize("params, words", [
    ({"alpha": 0}, "alpha must be a finite number > 0 and <= 1"),
    ({"alpha": 1.5}, "alpha must be a finite number > 0 and <= 1"),
    ({"alpha": "0.1"}, "'alpha' must be float"),
    ({"heads": "L1H0 16-3"}, "heads: '16-3' is not a TransformerLens head label"),
    ({"heads": "L1H"}, "heads: 'L1H' is not a TransformerLens head label"),
    ({"heads": [[1, 0]]}, "'heads' must be str"),
    ({"emphasize": [""]}, "emphasize holds texts"),
    ({"emphasize": 3}, "'emphasize' must be"),
    ({"beta": 2.0}, "has no parameter 'beta'"),
])
def test_bad_parameters_are_one_line_before_any_model_loads(params, words, no_model):
    with pytest.raises(ConfigError, match=re.escape(words)) as caught:
        DecodingConfig(method="pasta", params=params)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("method 'pasta'")


def test_heads_the_model_lacks_and_texts_a_prompt_lacks_are_one_line(tiny_llama):
    for heads, words in (("L4H0", "head L4H0 is outside the model (4 layers x 4 heads)"),
                         ("L1H4", "head L1H4 is outside the model"), ("", "it names none")):
        with pytest.raises(ConfigError, match=re.escape(words)) as caught:
            generate(tiny_llama, PROMPT, configs(heads=heads)["text"], backend="sdpa")
        assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"the emphasize text 'Give a route' is not in prompt #1$"):
        generate_batch(tiny_llama, [PROMPT, OTHER], {"x": configs()["text"].with_params(emphasize=["Give a route"])},
                       backend="sdpa")
    with pytest.raises(ConfigError, match="no chat template, hence no user message"):
        generate(tiny_llama, PROMPT, configs()["message"], chat=False, backend="sdpa")


def test_pasta_is_one_pass_biasing_only_its_heads(tiny_llama):
    method = REGISTRY["pasta"](configs()["text"], None, tiny_llama.spec)
    assert not method.uses_heads and method.heads_for(configs()["text"], tiny_llama, None) is None
    bias = method.steered.bias
    assert bias is not None and bias.layers == (0, 1, 2, 3) and bias.heads == ((0, 1), (1, 0), (2, 3), (3, 1))
    assert method.steered.reads == () and method.warmup_plan.bias is None
    assert not configs()["text"].changes_prefill  # it shares vanilla's prefill


def teacher_forced(model, config, prompts, golds) -> torch.Tensor:
    """Each prompt's gold mean log-probability per token, teacher forced through `config`'s decoding."""
    out = generate_batch(model, prompts, {"x": config}, forced=golds, backend="sdpa")["x"]
    return torch.tensor([r.forced.summary(g)["tf_logprob"] for r, g in
                         zip(out, [model.tokenizer(g, add_special_tokens=False)["input_ids"] for g in golds])],
                        dtype=torch.float64)


@pytest.mark.parametrize("style, emphasize", [("llama", (SPAN,)), ("gemma3", ())])
def test_a_head_s_profile_is_teacher_forced_pasta_with_that_head_over_vanilla(style, emphasize, tiny_of):
    model = tiny_of(style)
    candidates = [(0, 2), (1, 3), (3, 0)]
    # batches of one and a padded batch of two give the same profile
    profile = profile_heads(model, [PROMPT, OTHER], GOLDS, emphasize, 0.05, heads=candidates, batch_size=2,
                            progress=False)
    alone = profile_heads(model, [PROMPT, OTHER], GOLDS, emphasize, 0.05, heads=candidates, batch_size=1,
                          progress=False)
    assert torch.allclose(profile.nan_to_num(), alone.nan_to_num(), atol=1e-5)
    assert profile.shape == (model.spec.n_layers, model.spec.n_heads)
    assert profile.isnan().sum() == profile.numel() - len(candidates)
    vanilla = teacher_forced(model, DecodingConfig(method="vanilla", max_new_tokens=64), [PROMPT, OTHER], GOLDS)
    for layer, head in candidates:
        steered = DecodingConfig(method="pasta", max_new_tokens=64,
                                 params={"alpha": 0.05, "heads": f"L{layer}H{head}", "emphasize": list(emphasize)})
        gain = (teacher_forced(model, steered, [PROMPT, OTHER], GOLDS) - vanilla).mean()
        assert float(profile[layer, head]) == pytest.approx(float(gain), abs=1e-5), (layer, head)
        assert abs(float(gain)) > 1e-4  # the head changes the answer's probability
    ranked = sorted(candidates, key=lambda p: -profile[p].item())
    assert top_heads(profile, 2) == " ".join(f"L{layer}H{head}" for layer, head in ranked[:2])


def test_top_heads_writes_the_best_as_pasta_s_parameter():
    scores = torch.tensor([[0.1, float("nan")], [0.3, -0.2]])
    assert top_heads(scores, 2) == "L1H0 L0H0"
    assert top_heads(scores, 9) == "L1H0 L0H0 L1H1"  # no more than were profiled
    assert parse_heads(top_heads(scores, 2)) == ((0, 0), (1, 0))
    with pytest.raises(ConfigError, match="n >= 1"):
        top_heads(scores, 0)
