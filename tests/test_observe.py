"""Hooks and read-outs scoped by `observe(...)`: a call's own `read=` gives what a context's does,
nesting adds hooks, a read or callback given twice is refused, and what a context is given is
checked up front."""

import pytest
import torch

from dysco_interp import DecodingConfig, Read, compare_methods, generate
from dysco_interp.decoding.observe import current_observation, observe
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import scores_name

PROMPT = "You can travel from Paris to Berlin by train. Rome is quiet. " * 4 + "Give a route from Paris to Berlin."
CONFIG = DecodingConfig(method="vanilla", max_new_tokens=5)


def damp(layer):
    """A hook that halves one layer's scores: it changes the tokens, so running it is visible."""
    def fn(scores, hook):
        return scores * 0.5

    return (scores_name(layer), fn)


def test_a_context_s_read_is_the_call_s_own(tiny_llama):
    read = Read(((0, 1), (2, 0)), returns="rows")
    by_keywords, by_context = [], []
    with observe(tiny_llama, hooks=[damp(1)], on_read=lambda step, out: by_keywords.append(out.rows)):
        ours = generate(tiny_llama, PROMPT, CONFIG, read=read)
    with observe(tiny_llama, hooks=[damp(1)], read=read, on_read=lambda step, out: by_context.append(out.rows)):
        theirs = generate(tiny_llama, PROMPT, CONFIG)
        both = compare_methods(tiny_llama, PROMPT, {"a": CONFIG, "b": CONFIG})  # every call inside observes
    assert theirs.tokens == ours.tokens != generate(tiny_llama, PROMPT, CONFIG).tokens
    assert both["a"].tokens == both["b"].tokens == ours.tokens
    assert len(by_context) == 3 * len(by_keywords) and all(torch.equal(a, b) for a, b in zip(by_keywords, by_context))
    assert current_observation().hooks == () and current_observation().read is None  # the context is gone


def test_contexts_nest_and_refuse_a_read_given_twice(tiny_llama):
    with observe(hooks=[damp(1)]):
        with observe(hooks=[damp(2)]):
            assert len(current_observation().hooks) == 2
            nested = generate(tiny_llama, PROMPT, CONFIG)
        assert len(current_observation().hooks) == 1
    with observe(hooks=[damp(1), damp(2)]):
        assert nested.tokens == generate(tiny_llama, PROMPT, CONFIG).tokens
    with observe(read=Read(((0, 1),))):
        with pytest.raises(ConfigError, match="read is set by an observe"):
            generate(tiny_llama, PROMPT, CONFIG, read=Read(((1, 1),)))
        with pytest.raises(ConfigError, match="read is set by an observe"), observe(read=Read(((1, 1),))):
            pass


def test_a_context_checks_what_it_is_given_before_anything_runs(tiny_llama):
    with pytest.raises(ConfigError, match="outside the model"), observe(tiny_llama, read=Read(((99, 0),))):
        pass
    with pytest.raises(ConfigError, match="plan.Read"), observe(read=[(0, 1)]):
        pass
    with pytest.raises(ConfigError, match="on_read"), observe(on_read="print"):
        pass
    with pytest.raises(ConfigError, match="wrap one pair in a list"), observe(hooks=damp(1)):
        pass
    with pytest.raises(ConfigError, match="is no hook point"), observe(tiny_llama, hooks=[("blocks.0.nope", print)]):
        pass
    with observe(hooks=[damp(1)]), pytest.raises(ConfigError, match="bridge"):
        generate(tiny_llama, PROMPT, CONFIG, backend="sdpa")  # hooks need the bridge, from a context too
