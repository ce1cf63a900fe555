"""Wrong types through the Python API are the package's own errors, naming what was wrong."""

import pytest

from dysco_interp.decoding.config import DecodingConfig, preset
from dysco_interp.decoding.loop import compare_methods, dysco_generate, generate, generate_batch
from dysco_interp.decoding.methods import REGISTRY, SelectionParams
from dysco_interp.decoding.reference import reference_generate
from dysco_interp.decoding.sampling import SamplingConfig
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet


@pytest.mark.parametrize("fields, named", [
    ({"warmup": True}, "warmup"),
    ({"warmup": 8.0}, "warmup"),
    ({"max_new_tokens": True}, "max_new_tokens"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"record_positions": 1}, "record_positions"),
    ({"enable_thinking": "off"}, "enable_thinking"),
    ({"sampling": None}, "sampling"),
    ({"sampling": {"temperature": 0.7}}, "sampling"),
    ({"method": ["dysco"]}, "method"),
    ({"method": None}, "method"),
])
def test_decoding_config_fields_are_typed(fields, named):
    with pytest.raises(ConfigError, match=named):
        DecodingConfig(**fields)


# A method's parameters, by their Python names, as its errors name them
@pytest.mark.parametrize("method, values, message", [
    ("dysco", {"beta": "2"}, "strength beta must be a finite number > 0, got '2'"),
    ("dysco", {"beta": True}, "strength beta must be a finite number > 0, got True"),
    ("dysco", {"select_p": None}, r"select_p must be in \(0, 1\], got None"),
    ("dysco", {"select_k": True}, "select_k must be an integer >= 1, got True"),
    ("dysco", {"select_k": 4096.0}, r"select_k must be an integer >= 1, got 4096\.0"),
    ("dysco", {"decay": "0.75"}, "decay must be a finite number >= 0, got '0.75'"),
    ("uniattns", {"tau": True}, "parameter 'tau' must be float, got True"),
    ("uniattns", {"tau": "0.8"}, "parameter 'tau' must be float, got '0.8'"),
    ("dysco-random", {"head_seed": True}, r"head_seed must be an integer in 0\.\.9223372036854775807, got True"),
    ("dysco-random", {"head_seed": 10**30}, r"head_seed must be an integer in 0\.\.9223372036854775807, got 10{30}"),
    ("dysco-random", {"head_seed": "0"}, r"head_seed must be an integer in 0\.\.9223372036854775807, got '0'"),
    ("dysco", {"template_masking": "yes"}, "template_masking must be one of 'reference', 'skeleton', 'off', got 'yes'"),
    ("dysco", {"template_masking": True}, r"template_masking must be one of .*, got True \(the old switch: "
                                          r"True is 'skeleton', False is 'off'\)"),
    ("dysco", {"schedule": "official"}, "schedule must be one of 'reference', 'paper', got 'official'"),
    ("dysco", {"k_fraction": 0.0}, r"k_fraction must be in \(0, 1\] or None, got 0\.0"),
    ("dysco", {"k_fraction": 1.5}, r"k_fraction must be in \(0, 1\] or None, got 1\.5"),
    ("dysco", {"k_fraction": True}, r"k_fraction must be in \(0, 1\] or None, got True"),
])
def test_method_parameters_are_typed(method, values, message):
    with pytest.raises(ConfigError, match=f"^method '{method}': {message}$"):
        DecodingConfig(method=method, params=values)
    with pytest.raises(ConfigError, match=f"^method '{method}': {message}$"):
        DecodingConfig(method=method).with_params(**values)
    with pytest.raises(ConfigError, match=f"^{message}$"):
        REGISTRY[method].Params(**values)


# The older flat spelling is checked as the typed one, for one release, with a notice: a
# parameter of another method (tau, head_seed beside dysco) as the built-in method that has it.
@pytest.mark.parametrize("fields, named", [
    ({"beta": "2"}, "method 'dysco': strength beta must be a finite number > 0, got '2'"),
    ({"top_p": None}, r"method 'dysco': select_p must be in \(0, 1\], got None"),
    ({"top_k": 4096.0}, r"method 'dysco': select_k must be an integer >= 1, got 4096\.0"),
    ({"top_k_fraction": 1.5}, r"method 'dysco': k_fraction must be in \(0, 1\] or None, got 1\.5"),
    ({"template_masking": True}, "template_masking.*True is 'skeleton'"),
    ({"tau": "0.8"}, "^parameter 'tau' must be float, got '0.8'$"),
    ({"head_seed": 10**30}, r"^head_seed must be an integer in 0\.\.9223372036854775807, got 10{30}$"),
])
def test_flat_parameters_are_typed_for_one_release_with_a_notice(fields, named):
    with pytest.warns(DeprecationWarning, match="older flat spelling"), pytest.raises(ConfigError, match=named):
        DecodingConfig(**fields)


@pytest.mark.parametrize("fields, named", [
    ({"temperature": None}, "temperature"),
    ({"temperature": "0.7"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": None}, "top_p"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": True}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"top_k": -1}, "top_k"),
    ({"seed": 10**30}, "seed"),
    ({"seed": -1}, "seed"),
    ({"seed": "0"}, "seed"),
    ({"seed": True}, "seed"),
])
def test_sampling_config_fields_are_typed(fields, named):
    with pytest.raises(ConfigError, match=named):
        SamplingConfig(**fields)


def test_valid_configs_still_build():
    assert DecodingConfig(params=SelectionParams(beta=2, select_k=64)).params.select_k == 64
    assert DecodingConfig(method="dysco-random", params={"head_seed": 2**63 - 1}).parameter("head_seed") == 2**63 - 1
    assert SamplingConfig(temperature=1, top_p=0.9, top_k=5, seed=2**63 - 1).seed == 2**63 - 1
    assert preset("paper", method="uniattns", params={"tau": 0.8}).params.tau == 0.8
    with pytest.warns(DeprecationWarning, match="older flat spelling"):  # for one release
        flat = DecodingConfig(beta=2, top_k=64, head_seed=2**63 - 1)
    with pytest.warns(DeprecationWarning, match="older flat spelling"):
        assert flat.top_k == 64
    assert flat.params.select_k == 64 and flat.parameter("head_seed") == 2**63 - 1
    with pytest.warns(DeprecationWarning, match="older flat spelling"):
        assert preset("paper", tau=0.8).parameter("tau") == 0.8
    with pytest.raises(ConfigError, match="unknown preset"):
        preset(["paper"])


def test_decoding_entry_points_name_the_wrong_argument(tiny_llama):
    config = DecodingConfig(max_new_tokens=2)
    with pytest.raises(ConfigError, match=r"heads must be a HeadSet, \(layer, head\) pairs, .* got \[1, 0\]"):
        dysco_generate(tiny_llama, "hello", [1, 0], config)
    with pytest.raises(ConfigError, match="unknown option.*max_tokens; the decoding options are method, beta"):
        dysco_generate(tiny_llama, "hello", [(1, 0)], config, max_tokens=3)
    with pytest.raises(ConfigError, match="must be a DecodingConfig .* got None"):
        dysco_generate(tiny_llama, "hello", HeadSet([(1, 0)]), None)
    with pytest.raises(ConfigError, match="must be a DecodingConfig .* got 'paper'"):
        dysco_generate(tiny_llama, "hello", HeadSet([(1, 0)]), "paper")
    with pytest.raises(ConfigError, match="prompt is None"):
        dysco_generate(tiny_llama, None, HeadSet([(1, 0)]), config)
    with pytest.raises(ConfigError, match="prompt is empty"):
        dysco_generate(tiny_llama, "  ", HeadSet([(1, 0)]), config)
    with pytest.raises(ConfigError, match="message 0 must be a dict"):
        dysco_generate(tiny_llama, [("user", "hi")], HeadSet([(1, 0)]), config)
    with pytest.raises(ConfigError, match="'v' must be a DecodingConfig"):
        compare_methods(tiny_llama, "hello", {"v": "vanilla"})
    with pytest.raises(ConfigError, match="prompts must be a list of prompts"):
        generate_batch(tiny_llama, "hello", {"v": DecodingConfig(method="vanilla")})
    with pytest.raises(ConfigError, match="prompt #1 is empty"):
        generate_batch(tiny_llama, ["hello", ""], {"v": DecodingConfig(method="vanilla")})


def test_plain_generate_names_the_wrong_argument(tiny_llama):
    with pytest.raises(ConfigError, match="prompt is None"):
        reference_generate(tiny_llama, None)
    with pytest.raises(ConfigError, match="prompt is empty"):
        reference_generate(tiny_llama, "")
    with pytest.raises(ConfigError, match="prompt must be text"):
        reference_generate(tiny_llama, [])
    with pytest.raises(ConfigError, match="token ids must be integers"):
        reference_generate(tiny_llama, [1, "2"])
    with pytest.raises(ConfigError, match="max_new_tokens"):
        reference_generate(tiny_llama, "hi", max_new_tokens=True)
    with pytest.raises(ConfigError, match="sampling must be a SamplingConfig"):
        reference_generate(tiny_llama, "hi", sampling=None)
    assert len(reference_generate(tiny_llama, [1, 2, 3], max_new_tokens=2).tokens) <= 2


def test_heads_and_options_in_the_forms_users_write(tiny_llama):
    pairs = dysco_generate(tiny_llama, "hello", [(1, 0), (2, 3)], max_new_tokens=3, params={"beta": 4.0})
    labels = dysco_generate(tiny_llama, "hello", "L1H0,L2H3", DecodingConfig(max_new_tokens=3), params={"beta": 4.0})
    assert pairs.tokens == labels.tokens and len(pairs.tokens) <= 3
    assert pairs.trace.heads == [(1, 0), (2, 3)]
    by_keyword = generate(tiny_llama, "hello", method="dysco", heads=[(1, 0), (2, 3)], params={"beta": 4.0},
                          max_new_tokens=3)
    assert by_keyword.tokens == pairs.tokens and by_keyword.method == "dysco"
    with pytest.warns(DeprecationWarning, match="older flat spelling"):  # the flat keyword, for one release
        flat = generate(tiny_llama, "hello", method="dysco", heads=[(1, 0), (2, 3)], beta=4.0, max_new_tokens=3)
    assert flat.tokens == pairs.tokens
