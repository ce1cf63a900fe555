"""InstABoost as a plan program: the same tokens on bridge, sdpa and static, in a padded batch as
alone; the tokens of InstABoost written directly as TransformerLens hooks on the bridge; vanilla's
tokens at M = 1; and bad parameters refused in one line before any model loads."""

import math
import re

import pytest

import dysco_interp.decoding.baselines.instaboost  # noqa: F401  (registers the method)
from dysco_interp import DecodingConfig, generate, generate_batch, observe
from dysco_interp.decoding.baselines.instaboost import InstABoost, instruction_keys
from dysco_interp.decoding.methods import REGISTRY
from dysco_interp.decoding.passes import current_pass
from dysco_interp.decoding.prompts import prepare_prompt
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import scores_name
from dysco_interp.models.tiny import STYLES

INSTRUCTION = "Answer with one short line."
CONTEXT = "Rome is quiet."
PROMPT = f"{INSTRUCTION} " + f"You can travel from Paris to Berlin by train. {CONTEXT} " * 4 + \
    "Give a route from Paris to Berlin."
OTHER = f"{INSTRUCTION} " + f"Oslo has a harbour. {CONTEXT} Bergen is rainy. " * 2 + "Which city has a harbour?"
N_NEW = 8
M = 20.0  # strong enough that the tiny models' tokens change


def configs(m: float = M) -> dict[str, DecodingConfig]:
    """The instruction by its text, the user message less its context, and vanilla."""
    return {"text": DecodingConfig(method="instaboost", params={"M": m, "instruction": [INSTRUCTION]},
                                   max_new_tokens=N_NEW),
            "message": DecodingConfig(method="instaboost", params={"M": m, "context": [CONTEXT]},
                                      max_new_tokens=N_NEW),
            "vanilla": DecodingConfig(method="vanilla", max_new_tokens=N_NEW)}


@pytest.mark.parametrize("style", STYLES)
def test_instaboost_gives_the_same_tokens_on_every_backend_in_a_padded_batch_as_alone(style, tiny_of,
                                                                                      tokens_everywhere):
    model = tiny_of(style)
    assert len(prepare_prompt(model, PROMPT).ids) != len(prepare_prompt(model, OTHER).ids)  # the batch is padded
    out = tokens_everywhere(model, configs(), (PROMPT, OTHER))
    for backend in ("sdpa", "static"):
        assert out[backend] == out["bridge"], backend
    for name in ("text", "message"):  # the boost changes the output, so equality means something
        assert out["bridge"][name] != out["bridge"]["vanilla"], name


def test_m_1_gives_vanilla_s_tokens_on_every_backend(tiny_llama, tokens_everywhere):
    out = tokens_everywhere(tiny_llama, configs(m=1.0), (PROMPT, OTHER))
    for backend, tokens in out.items():
        assert tokens["text"] == tokens["message"] == tokens["vanilla"], backend


def keys_of(model, prompt: str, boosted: str, left_out: str | None = None) -> list[int]:
    """The prompt tokens whose characters overlap `boosted` and not `left_out` (every occurrence),
    from the tokenizer's own offsets of the rendered chat."""
    text = prepare_prompt(model, prompt).text
    encoded = model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert encoded["input_ids"] == list(prepare_prompt(model, prompt).ids)

    def overlapping(needle: str) -> set[int]:
        spans = [(m.start(), m.end()) for m in re.finditer(re.escape(needle), text)]
        return {i for i, (a, b) in enumerate(encoded["offset_mapping"]) if any(a < e and b > s for s, e in spans)}

    return sorted(overlapping(boosted) - (overlapping(left_out) if left_out else set()))


def direct_instaboost(model, m: float, keys: list[int]):
    """InstABoost written directly as TransformerLens hooks: log M on the instruction keys' scores
    in every layer, in the passes of the steps vanilla's schedule runs as the method's own (the
    last prompt tokens and the generated ones); the prefill and the warm-up tokens untouched."""

    def hook(scores, hook):
        p = current_pass()
        if p is None or p.phase not in ("intervention-warmup", "decode"):
            return scores
        out = scores.float().clone()
        out[..., keys] += math.log(m)
        return out

    return [(scores_name(layer), hook) for layer in range(model.spec.n_layers)]


def plan_and_hooks(model, config: DecodingConfig, keys: list[int], n_new: int = N_NEW):
    """(the plan program's tokens, the direct hooks' tokens, vanilla's tokens) on the bridge."""
    ours = generate(model, PROMPT, config, backend="bridge").tokens
    vanilla = DecodingConfig(method="vanilla", max_new_tokens=n_new)
    with observe(model, hooks=direct_instaboost(model, config.params.M, keys)):
        direct = generate(model, PROMPT, vanilla, backend="bridge").tokens
    return ours, direct, generate(model, PROMPT, vanilla, backend="bridge").tokens


def test_instaboost_as_a_plan_equals_instaboost_written_as_bridge_hooks(tiny_llama):
    chosen = configs()
    cases = {"text": keys_of(tiny_llama, PROMPT, INSTRUCTION),
             "message": keys_of(tiny_llama, PROMPT, PROMPT, left_out=CONTEXT)}
    for name, keys in cases.items():
        ours, direct, vanilla = plan_and_hooks(tiny_llama, chosen[name], keys)
        assert ours == direct, name
        assert ours != vanilla, name


@pytest.mark.real_model
def test_instaboost_as_a_plan_equals_bridge_hooks_on_the_default_model(real_model):
    config = DecodingConfig(method="instaboost", params={"M": 20.0, "instruction": [INSTRUCTION]}, max_new_tokens=12)
    ours, direct, vanilla = plan_and_hooks(real_model, config, keys_of(real_model, PROMPT, INSTRUCTION), n_new=12)
    assert ours == direct
    assert ours != vanilla


def test_the_boosted_keys_are_every_occurrence_of_the_instruction_less_the_context(tiny_llama):
    prepared = prepare_prompt(tiny_llama, PROMPT)
    context = instruction_keys(prepared, (CONTEXT,), ())
    runs = [len(run) for run in "".join("x" if k else " " for k in context.tolist()).split()]
    assert len(runs) == 4  # every occurrence
    message = instruction_keys(prepared, (), (CONTEXT,))
    assert not (message & context).any()
    assert message.nonzero().flatten().tolist() == keys_of(tiny_llama, PROMPT, PROMPT, left_out=CONTEXT)
    # one text may be given as it is
    assert InstABoost.Params(instruction=INSTRUCTION).instruction == (INSTRUCTION,)
    assert DecodingConfig(method="instaboost", params={"instruction": INSTRUCTION}) == \
        DecodingConfig(method="instaboost", params={"instruction": [INSTRUCTION]})


@pytest.mark.parametrize("params, words", [
    ({"M": 0}, "M must be a finite number > 0"),
    ({"M": -2.0}, "M must be a finite number > 0"),
    ({"M": float("inf")}, "'M' must be float"),
    ({"M": "2"}, "'M' must be float"),
    ({"M": True}, "'M' must be float"),
    ({"instruction": [""]}, "instruction holds texts"),
    ({"instruction": [3]}, "instruction holds texts"),
    ({"instruction": 3}, "'instruction' must be"),
    ({"context": ["  "]}, "context holds texts"),
    ({"beta": 2.0}, "has no parameter 'beta'"),
])
def test_bad_parameters_are_one_line_before_any_model_loads(params, words, no_model):
    with pytest.raises(ConfigError, match=re.escape(words)) as caught:
        DecodingConfig(method="instaboost", params=params)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("method 'instaboost'")


def test_an_instruction_a_prompt_lacks_is_one_line_naming_it(tiny_llama):
    config = configs()["text"]
    # the second prompt of the batch lacks the second text
    with pytest.raises(ConfigError, match=r"the instruction text 'Give a route' is not in prompt #1$"):
        generate_batch(tiny_llama, [PROMPT, OTHER],
                       {"x": config.with_params(instruction=[INSTRUCTION, "Give a route"])}, backend="sdpa")
    with pytest.raises(ConfigError, match="no chat template, hence no user message"):
        generate(tiny_llama, PROMPT, configs()["message"], chat=False, backend="sdpa")
    with pytest.raises(ConfigError, match="leave nothing of the instruction"):
        generate(tiny_llama, PROMPT, config.with_params(context=[INSTRUCTION]), backend="sdpa")
    # by text, a prompt without the chat template works too
    plain = generate(tiny_llama, PROMPT, config, chat=False, backend="sdpa")
    assert len(plain.tokens) == N_NEW


def test_instaboost_is_one_biased_pass_that_reads_no_heads(tiny_llama):
    method = REGISTRY["instaboost"](configs()["text"], None, tiny_llama.spec)
    assert not method.uses_heads and method.heads_for(configs()["text"], tiny_llama, None) is None
    assert method.boosted.bias is not None and method.boosted.bias.layers == tuple(range(tiny_llama.spec.n_layers))
    assert method.boosted.reads == () and method.warmup_plan.bias is None
    assert not configs()["text"].changes_prefill  # it shares vanilla's prefill
