"""The prompt schedule: how many prompt tokens are prefilled, fed as unbiased context warm-up,
and fed with the method's full step, under the official code's schedule and the paper's text."""

import pytest

from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import generate
from dysco_interp.decoding.prompts import biased_prompt_steps, prepare_prompt
from dysco_interp.heads import HeadSet

PROMPT = "You can travel from Paris to Berlin by train. Rome is quiet. " * 4 + "Where can you go from Paris?"


def heads_for(model):
    s = model.spec
    return HeadSet([(1, 0), (2, 3)], model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


@pytest.mark.parametrize("style,thinking", [("llama", None), ("qwen2", None), ("qwen3", False)],
                         ids=["llama3", "chatml", "qwen3-thinking-off"])
@pytest.mark.parametrize("schedule,warmup", [("reference", 8), ("paper", 8), ("reference", 1), ("reference", 0),
                                             ("paper", 0)])
def test_prompt_steps_per_schedule(tiny_of, style, thinking, schedule, warmup):
    model = tiny_of(style)
    prepared = prepare_prompt(model, PROMPT, thinking)
    n, n_gen = len(prepared.ids), prepared.encoded.n_generation_prompt
    config = DecodingConfig(params={"schedule": schedule}, warmup=warmup, max_new_tokens=2, enable_thinking=thinking)
    steps = generate(model, PROMPT, config, heads=heads_for(model), prepared=prepared).trace.steps
    context = [s.position for s in steps if s.phase == "context-warmup"]
    biased = [s.position for s in steps if s.phase == "intervention-warmup"]
    n_biased = (n_gen + 1 if schedule == "reference" else n_gen) if warmup else n_gen
    # the prefill stops T_w + n_gen tokens before the end under both schedules
    assert (context + biased)[0] == n - warmup - n_gen
    assert len(context) == warmup + n_gen - n_biased
    assert biased == list(range(n - n_biased, n))
    assert all(s.n_selected is not None for s in steps if s.phase == "intervention-warmup")
    if schedule == "reference" and warmup:
        assert len(context) == warmup - 1 and biased[0] == n - n_gen - 1  # the last context token is biased
    if style == "qwen3":
        assert n_gen == len(model.tokenizer("<|im_start|>assistant\n<think>\n\n</think>\n\n")["input_ids"])


def test_biased_steps_never_exceed_the_tokens_fed():
    assert biased_prompt_steps(tail=12, n_gen=4, schedule="reference") == 5
    assert biased_prompt_steps(tail=12, n_gen=4, schedule="paper") == 4
    assert biased_prompt_steps(tail=3, n_gen=4, schedule="reference") == 3  # a prompt shorter than T_w + n_gen
