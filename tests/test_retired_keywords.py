"""The keywords the decoding calls took before `observe(...)` and `BackendSpec(...)`: each still
gives what its new form gives, for one release, with one DeprecationWarning of one line that names
the function called and points at the line that called it."""

import warnings
from pathlib import Path

import pytest

from dysco_interp import DecodingConfig, Read, compare_methods, generate, generate_batch, observe
from dysco_interp.decoding.backends import BackendSpec
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import scores_name

PROMPT = "You can travel from Paris to Berlin by train. Rome is quiet. " * 4 + "Give a route from Paris to Berlin."
CONFIG = DecodingConfig(method="vanilla", max_new_tokens=4)
READ = Read(((0, 1), (2, 0)), returns="span_mass", spans=((0, 5), (5, 20)))


def damp(layer):
    """A hook that halves one layer's scores: it changes the tokens, so running it is visible."""
    def fn(scores, hook):
        return scores * 0.5

    return (scores_name(layer), fn)


def notices(call):
    """What `call()` gives, and the DeprecationWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call()
    return out, [w for w in caught if issubclass(w.category, DeprecationWarning)]


def says(warned, *lines):
    """Each warning is one of `lines`' starts, one line long, and points at this file."""
    assert [str(w.message).split(" is deprecated")[0] for w in warned] == list(lines)
    for w in warned:
        message = str(w.message)
        assert "\n" not in message and "goes in the next release" in message
        assert Path(w.filename).name == Path(__file__).name, (message, w.filename)


def test_hooks_and_on_read_on_a_call_are_a_context_s(tiny_llama):
    kept_old, kept_new = [], []
    old, warned = notices(lambda: generate(tiny_llama, PROMPT, CONFIG, hooks=[damp(1)], read=READ,
                                           on_read=lambda step, out: kept_old.append(out.span_mass)))
    says(warned, "generate(hooks=)", "generate(on_read=)")
    assert "observe(model, hooks=...)" in str(warned[0].message)
    assert "observe(model, on_read=...)" in str(warned[1].message)
    with observe(tiny_llama, hooks=[damp(1)], on_read=lambda step, out: kept_new.append(out.span_mass)):
        new = generate(tiny_llama, PROMPT, CONFIG, read=READ)
    assert old.tokens == new.tokens != generate(tiny_llama, PROMPT, CONFIG).tokens
    assert len(kept_old) == len(kept_new) == len(old.trace.steps)
    assert all((a == b).all() for a, b in zip(kept_old, kept_new))


def test_read_out_is_read(tiny_llama):
    old, warned = notices(lambda: compare_methods(tiny_llama, PROMPT, {"v": CONFIG}, read_out=READ)["v"])
    says(warned, "compare_methods(read_out=)")
    assert "read=" in str(warned[0].message)
    new = generate(tiny_llama, PROMPT, CONFIG, read=READ)
    assert [s.read_mass for s in old.trace.steps] == [s.read_mass for s in new.trace.steps]
    assert old.trace.steps[0].read_mass is not None
    with pytest.raises(ConfigError, match="read_out= is read='s old name"):
        notices(lambda: generate(tiny_llama, PROMPT, CONFIG, read=READ, read_out=READ))


def test_backend_options_beside_a_name_are_its_spec_s(tiny_llama):
    old, warned = notices(lambda: generate_batch(tiny_llama, [PROMPT], {"v": CONFIG}, backend="static", graphs=False,
                                                 decode_attention="float32"))
    says(warned, "generate_batch(graphs=)", "generate_batch(decode_attention=)")
    assert all("BackendSpec(" in str(w.message) for w in warned)
    new = generate_batch(tiny_llama, [PROMPT], {"v": CONFIG},
                         backend=BackendSpec("static", graphs=False, decode_attention="float32"))
    assert old["v"][0].tokens == new["v"][0].tokens
    with pytest.raises(ConfigError, match="inside the BackendSpec"):
        notices(lambda: generate(tiny_llama, PROMPT, CONFIG, backend=BackendSpec("static"), graphs=False))


def test_an_unknown_keyword_is_the_error_python_gives(tiny_llama):
    with pytest.raises(TypeError, match=r"generate_batch\(\) got an unexpected keyword argument 'hoks'"):
        generate_batch(tiny_llama, [PROMPT], {"v": CONFIG}, hoks=[damp(1)])
    with pytest.raises(TypeError, match=r"compare_methods\(\) got an unexpected keyword argument 'hoks'"):
        compare_methods(tiny_llama, PROMPT, {"v": CONFIG}, hoks=[damp(1)])
    with pytest.raises(ConfigError, match="unknown option.*hoks; the decoding options are method"):
        generate(tiny_llama, PROMPT, CONFIG, hoks=[damp(1)])


def test_decode_batch_takes_read_out_as_read(tiny_llama):
    from dysco_interp.decoding.loop import decode_batch, prefill_prefix
    from dysco_interp.decoding.prompts import PromptBatch, pad_id, prepare_prompt

    batch = PromptBatch.of([prepare_prompt(tiny_llama, PROMPT)], pad_id(tiny_llama))
    prefix = prefill_prefix(tiny_llama, batch, CONFIG)
    [old], warned = notices(lambda: decode_batch(tiny_llama, batch, CONFIG, None, prefix, read_out=READ))
    says(warned, "decode_batch(read_out=)")
    [new] = decode_batch(tiny_llama, batch, CONFIG, None, prefix, read=READ)
    assert [s.read_mass for s in old.trace.steps] == [s.read_mass for s in new.trace.steps]
    with pytest.raises(TypeError, match="unexpected keyword argument 'hooks_'"):
        decode_batch(tiny_llama, batch, CONFIG, None, prefix, hooks_=())
