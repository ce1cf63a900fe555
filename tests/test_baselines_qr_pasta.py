"""QR-PASTA: the same tokens on bridge, sdpa and static, in a padded batch as alone; the tokens of
QR-PASTA written directly as TransformerLens hooks on the bridge (the QRHeads' rows read at the
first full step, the heaviest lines chosen, then PASTA's bias); vanilla's tokens at alpha = 1;
the pure choice math; and bad parameters refused in one line before any model loads."""

import math
import re

import pytest
import torch

import dysco_interp.decoding.baselines.qr_pasta  # noqa: F401  (registers the method)
from dysco_interp import DecodingConfig, generate, observe
from dysco_interp.decoding.baselines.qr_pasta import chosen_keys, heaviest_units, unit_masses
from dysco_interp.decoding.baselines.spans import unit_texts
from dysco_interp.decoding.methods import REGISTRY
from dysco_interp.decoding.passes import current_pass
from dysco_interp.decoding.prompts import prepare_prompt
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import layer_of, pattern_name, scores_name
from dysco_interp.models.tiny import STYLES

LINES = ["Answer with one short line.", "You can travel from Paris to Berlin by train.", "Rome is quiet.",
         "Oslo has a harbour. Bergen is rainy.", "Give a route from Paris to Berlin."]
PROMPT = "\n".join(LINES)
OTHER = "Answer briefly.\nMilan has a cathedral.\nTurin is near the Alps. Genoa has a port.\nWhich city has a port?"
N_NEW = 8
STEERED = "L0H1 L1H0 L2H3 L3H1"
QRHEADS = ((0, 0), (1, 2))


def qrheads(model):
    s = model.spec
    return HeadSet(list(QRHEADS), model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def configs(alpha: float = 0.01) -> dict[str, DecodingConfig]:
    return {"line": DecodingConfig(method="qr-pasta", params={"alpha": alpha, "heads": STEERED, "unit": "line",
                                                               "n_spans": 2}, max_new_tokens=N_NEW),
            "sentence": DecodingConfig(method="qr-pasta", params={"alpha": alpha, "heads": STEERED},
                                       max_new_tokens=N_NEW),
            "vanilla": DecodingConfig(method="vanilla", max_new_tokens=N_NEW)}


@pytest.mark.parametrize("style", STYLES)
def test_qr_pasta_gives_the_same_tokens_on_every_backend_in_a_padded_batch_as_alone(style, tiny_of,
                                                                                    tokens_everywhere):
    model = tiny_of(style)
    assert len(prepare_prompt(model, PROMPT).ids) != len(prepare_prompt(model, OTHER).ids)  # the batch is padded
    out = tokens_everywhere(model, configs(), (PROMPT, OTHER), qrheads(model))
    for backend in ("sdpa", "static"):
        assert out[backend] == out["bridge"], backend
    for name in ("line", "sentence"):
        assert out["bridge"][name] != out["bridge"]["vanilla"], name


def test_alpha_1_gives_vanilla_s_tokens_on_every_backend(tiny_llama, tokens_everywhere):
    out = tokens_everywhere(tiny_llama, configs(alpha=1.0), (PROMPT, OTHER), qrheads(tiny_llama))
    for backend, tokens in out.items():
        assert tokens["line"] == tokens["sentence"] == tokens["vanilla"], backend


def line_tokens(model, prompt: str) -> list[list[int]]:
    """Each line's tokens, from the tokenizer's own offsets of the rendered chat."""
    text = prepare_prompt(model, prompt).text
    offsets = model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    out = []
    for line in prompt.split("\n"):
        at = text.index(line)
        out.append([i for i, (a, b) in enumerate(offsets) if a < at + len(line) and b > at])
    return out


def plan_and_hooks(model, qr: HeadSet, steered_heads: str, n_new: int = N_NEW):
    """QR-PASTA as a plan (its result) and written directly as bridge hooks (its tokens), the lines
    the hooks chose, and vanilla's tokens."""
    n_prompt = len(prepare_prompt(model, PROMPT).ids)
    vanilla = DecodingConfig(method="vanilla", max_new_tokens=n_new)
    # 1. the QRHeads' rows at the first full step: nothing is biased before it, so vanilla's pass reads them
    rows = {}

    def read(pattern, hook):
        p = current_pass()
        if p is not None and p.phase == "intervention-warmup" and layer_of(hook) not in rows:
            rows[layer_of(hook)] = pattern[0, :, -1, :].float()

    with observe(model, hooks=[(pattern_name(layer), read) for layer in {layer for layer, _ in qr}]):
        generate(model, PROMPT, vanilla, backend="bridge")
    mean = sum(rows[layer][head] for layer, head in qr) / len(qr)
    # 2. the two heaviest lines
    lines = line_tokens(model, PROMPT)
    mass = [float(mean[tokens].sum()) for tokens in lines]
    best = sorted(sorted(range(len(lines)), key=lambda i: -mass[i])[:2])
    outside = [k for k in range(n_prompt) if not any(k in lines[i] for i in best)]
    # 3. PASTA's bias outside them in the steered heads, from the first full step on
    steered = [tuple(map(int, re.findall(r"\d+", label))) for label in steered_heads.split()]

    def bias(scores, hook):
        p = current_pass()
        if p is None or p.phase not in ("intervention-warmup", "decode"):
            return scores
        out = scores.float().clone()
        columns = [k for k in outside if k < scores.shape[-1]]
        for layer, head in steered:
            if layer == layer_of(hook):
                out[:, head, :, columns] += math.log(0.01)
        return out

    with observe(model, hooks=[(scores_name(layer), bias) for layer in {layer for layer, _ in steered}]):
        direct = generate(model, PROMPT, vanilla, backend="bridge").tokens
    config = configs()["line"].with_params(heads=steered_heads).replace(max_new_tokens=n_new)
    ours = generate(model, PROMPT, config, heads=qr, backend="bridge")
    return ours, direct, best, generate(model, PROMPT, vanilla, backend="bridge").tokens


def test_qr_pasta_as_a_plan_equals_qr_pasta_written_as_bridge_hooks(tiny_llama):
    ours, direct, best, vanilla = plan_and_hooks(tiny_llama, qrheads(tiny_llama), STEERED)
    assert ours.tokens == direct
    assert ours.tokens != vanilla
    assert [s.own for s in ours.trace.steps if s.own] == [{"emphasized": best}]  # chosen once, at the first full step


@pytest.mark.real_model
def test_qr_pasta_as_a_plan_equals_bridge_hooks_on_the_default_model(real_model):
    from dysco_interp.heads import shipped_heads

    steered = " ".join(f"L{layer}H{head}" for layer in range(8, 20) for head in range(real_model.spec.n_heads))
    qr = shipped_heads("smollm2-135m", spec=real_model.spec)
    ours, direct, best, vanilla = plan_and_hooks(real_model, qr, steered, n_new=12)
    assert ours.tokens == direct
    assert ours.tokens != vanilla
    assert [s.own for s in ours.trace.steps if s.own] == [{"emphasized": best}]


def test_the_choice_is_the_heaviest_units_by_attention_mass():
    attention = torch.tensor([0.1, 0.2, 0.3, 0.05, 0.05, 0.3])
    spans = [(0, 2), (2, 3), (3, 5), (5, 6)]
    masses = unit_masses(attention, spans)
    assert torch.allclose(masses, torch.tensor([0.3, 0.3, 0.1, 0.3]))
    assert heaviest_units(masses, 2) == [0, 1]  # of equal masses the earlier first
    assert heaviest_units(masses, 9) == [0, 1, 2, 3]
    assert chosen_keys(spans, [0, 3], 7).tolist() == [True, True, False, False, False, True, False]
    text = "One. Two!  Three?\n\n  Four\nFive. "
    assert [text[a:b] for a, b in unit_texts(text, "sentence")] == ["One.", "Two!", "Three?", "Four", "Five."]
    assert [text[a:b] for a, b in unit_texts(text, "line")] == ["One. Two!  Three?", "Four", "Five."]


def test_qr_pasta_reads_the_qrheads_once_then_biases_in_one_pass(tiny_llama):
    config = configs()["line"]
    method = REGISTRY["qr-pasta"](config, qrheads(tiny_llama), tiny_llama.spec)
    assert method.uses_heads and method.warmup_plan.reads == ()
    assert method.reads.partial.reads[0].heads == QRHEADS and method.reads.partial.stop_after == 1
    assert method.steered.bias is not None and method.steered.reads == ()
    with pytest.raises(ConfigError, match="needs a non-empty head set"):
        generate(tiny_llama, PROMPT, config, backend="sdpa")


@pytest.mark.parametrize("params, words", [
    ({"n_spans": 0}, "n_spans must be a finite number >= 1"),
    ({"n_spans": 1.5}, "'n_spans' must be int"),
    ({"unit": "word"}, "unit must be one of"),
    ({"alpha": 2}, "alpha must be a finite number > 0 and <= 1"),
    ({"heads": "layer 3"}, "is not a TransformerLens head label"),
    ({"emphasize": ["x"]}, "has no parameter 'emphasize'"),
])
def test_bad_parameters_are_one_line_before_any_model_loads(params, words, no_model):
    with pytest.raises(ConfigError, match=re.escape(words)) as caught:
        DecodingConfig(method="qr-pasta", params=params)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("method 'qr-pasta'")
