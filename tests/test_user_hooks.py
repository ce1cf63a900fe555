"""User TransformerLens hooks during decoding: they fire in every bridge pass, the prompt's
prefill included, `current_pass()` tells the passes apart, a no-op hook changes no token, and
the fast backends refuse hooks in one line."""

import pytest
import torch

from dysco_interp.decoding import current_pass
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import compare_methods, generate, generate_batch
from dysco_interp.decoding.observe import observe
from dysco_interp.decoding.prompts import prepare_prompt
from dysco_interp.errors import ConfigError

PROMPT = "you can travel from paris to berlin by train. where can you travel from paris?"
HEADS = [(1, 0), (2, 3)]  # L* = 2


def recorder(seen: list):
    def record(tensor, hook):
        p = current_pass()
        seen.append((hook.name, p.kind, p.phase, p.step, tuple(tensor.shape), p.method))
    return record


def test_pattern_hook_sees_prefill_warmup_then_partial_and_biased(tiny_llama):
    model, seen = tiny_llama, []
    config = DecodingConfig(max_new_tokens=4)
    with observe(model, hooks=[("blocks.1.attn.hook_pattern", recorder(seen)),
                               ("blocks.3.attn.hook_pattern", recorder(seen))]):
        result = generate(model, PROMPT, config, heads=HEADS)
    n = len(result.prompt_ids)
    n_gen = prepare_prompt(model, PROMPT).encoded.n_generation_prompt
    n_prefix = n - (config.warmup + n_gen)
    heads = model.spec.n_heads
    expected = [(layer, "prefill", "prefill", None, (1, heads, n_prefix, n_prefix))
                for layer in ("blocks.1.attn.hook_pattern", "blocks.3.attn.hook_pattern")]
    step = 0
    for _ in range(config.warmup - 1):  # the context warm-up: one unbiased pass per token
        keys = n_prefix + step + 1
        expected += [(f"blocks.{layer}.attn.hook_pattern", "plain", "context-warmup", step, (1, heads, 1, keys))
                     for layer in (1, 3)]
        step += 1
    for phase, count in (("intervention-warmup", n_gen + 1), ("decode", len(result.tokens) - 1)):
        for _ in range(count):
            keys = n_prefix + step + 1
            # the partial pass stops after layer L* = 2: layer 3's hook fires in the biased pass only
            expected += [("blocks.1.attn.hook_pattern", "partial", phase, step, (1, heads, 1, keys)),
                         ("blocks.1.attn.hook_pattern", "biased", phase, step, (1, heads, 1, keys)),
                         ("blocks.3.attn.hook_pattern", "biased", phase, step, (1, heads, 1, keys))]
            step += 1
    assert [s[:5] for s in seen] == expected
    assert {s[5] for s in seen} == {"dysco"}
    assert step == len(result.trace.steps)  # each pass's step indexes the trace
    assert current_pass() is None  # nothing is announced outside the loop


@pytest.mark.parametrize("style", ["llama", "gemma3"])
@pytest.mark.parametrize("method", ["dysco", "vanilla", "dysco-reuse", "dysco-static"])
def test_a_noop_hook_changes_no_token(tiny_of, style, method):
    model = tiny_of(style)
    config = DecodingConfig(method=method, max_new_tokens=6)
    calls = []

    def noop(tensor, hook):
        calls.append(hook.name)

    plain = generate(model, PROMPT, config, heads=HEADS)
    with observe(model, hooks=[(lambda name: name.endswith("attn.hook_pattern"), noop), ("hook_embed", noop)]):
        hooked = generate(model, PROMPT, config, heads=HEADS)
    assert hooked.tokens == plain.tokens
    assert len({c for c in calls if c.endswith("hook_pattern")}) == model.spec.n_layers  # the filter matched all


def test_what_a_hook_returns_is_used_in_every_pass(tiny_llama):
    zero = [("ln_final.hook_normalized", lambda t, hook: torch.zeros_like(t))]
    with observe(tiny_llama, hooks=zero):
        result = generate(tiny_llama, PROMPT, DecodingConfig(max_new_tokens=3), heads=HEADS)
    assert result.tokens == [0, 0, 0]  # all-zero logits: the argmax is token 0 at every step


def test_methods_are_named_and_a_shared_prefill_is_nobodys(tiny_llama):
    seen = []
    configs = {"plain": DecodingConfig(method="vanilla", max_new_tokens=2),
               "strong": DecodingConfig(max_new_tokens=2, params={"beta": 3.0})}
    with observe(tiny_llama, hooks=[("blocks.0.attn.hook_pattern", recorder(seen))]):
        compare_methods(tiny_llama, PROMPT, configs, HEADS)
    prefills = [s for s in seen if s[1] == "prefill"]
    assert len(prefills) == 1 and prefills[0][5] is None  # one prefill, shared by both methods
    assert {s[5] for s in seen if s[1] != "prefill"} == {"plain", "strong"}
    assert {s[1] for s in seen if s[5] == "plain"} == {"plain"}
    seen.clear()
    with observe(tiny_llama, hooks=[("blocks.0.attn.hook_pattern", recorder(seen))]):
        generate_batch(tiny_llama, [PROMPT], {"only": DecodingConfig(method="vanilla", max_new_tokens=2)})
    assert seen[0][1] == "prefill" and seen[0][5] == "only"


def test_hooks_are_refused_where_no_bridge_runs_and_in_wrong_forms(tiny_llama):
    hook = ("blocks.0.attn.hook_pattern", lambda t, hook: None)
    for backend in ("sdpa", "static"):
        with observe(tiny_llama, hooks=[hook]), pytest.raises(
                ConfigError, match="hooks run only where the TransformerLens bridge runs: pass backend='bridge'"):
            generate(tiny_llama, PROMPT, backend=backend, max_new_tokens=2)
    with pytest.raises(ConfigError, match=r"wrap one pair in a list"), observe(tiny_llama, hooks=hook):
        pass
    with pytest.raises(ConfigError, match="'blocks.0.attn.hook_patern' is no hook point .* did you mean "
                                          "'blocks.0.attn.hook_pattern'"):
        with observe(tiny_llama, hooks=[("blocks.0.attn.hook_patern", hook[1])]):
            pass
    with observe(hooks=[("blocks.0.attn.hook_patern", hook[1])]), pytest.raises(ConfigError, match="no hook point"):
        generate(tiny_llama, PROMPT, max_new_tokens=2)  # a context without the model: checked by the call
    with pytest.raises(ConfigError, match="must be callable"), observe(hooks=[("blocks.0.attn.hook_pattern", "print")]):
        pass
    with pytest.raises(ConfigError, match="hook #0 is 'blocks.0.attn.hook_pattern'"):
        with observe(hooks=["blocks.0.attn.hook_pattern"]):
            pass
    with pytest.raises(ConfigError, match="hooks must be a list"), observe(hooks="blocks.0.attn.hook_pattern"):
        pass
