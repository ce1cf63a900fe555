"""Wrong types through the Python API are the package's own errors, naming what was wrong."""

import pytest

from dysco_interp.decoding.config import DecodingConfig, preset
from dysco_interp.decoding.loop import compare_methods, dysco_generate, generate, generate_batch
from dysco_interp.decoding.reference import reference_generate
from dysco_interp.decoding.sampling import SamplingConfig
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet


@pytest.mark.parametrize("fields, named", [
    ({"beta": "2"}, "beta"),
    ({"beta": True}, "beta"),
    ({"top_p": None}, "top_p"),
    ({"top_k": True}, "top_k"),
    ({"top_k": 4096.0}, "top_k"),
    ({"decay": "0.75"}, "decay"),
    ({"warmup": True}, "warmup"),
    ({"warmup": 8.0}, "warmup"),
    ({"tau": True}, "tau"),
    ({"tau": "0.8"}, "tau"),
    ({"head_seed": True}, "head_seed"),
    ({"head_seed": 10**30}, "head_seed"),
    ({"head_seed": "0"}, "head_seed"),
    ({"max_new_tokens": True}, "max_new_tokens"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"template_masking": "yes"}, "template_masking"),
    ({"template_masking": True}, "template_masking.*True is 'skeleton'"),
    ({"schedule": "official"}, "schedule"),
    ({"top_k_fraction": 0.0}, "top_k_fraction"),
    ({"top_k_fraction": 1.5}, "top_k_fraction"),
    ({"top_k_fraction": True}, "top_k_fraction"),
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
    assert DecodingConfig(beta=2, top_k=64, head_seed=2**63 - 1).top_k == 64
    assert SamplingConfig(temperature=1, top_p=0.9, top_k=5, seed=2**63 - 1).seed == 2**63 - 1
    assert preset("paper", tau=0.8).tau == 0.8
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
    pairs = dysco_generate(tiny_llama, "hello", [(1, 0), (2, 3)], max_new_tokens=3, beta=4.0)
    labels = dysco_generate(tiny_llama, "hello", "L1H0,L2H3", DecodingConfig(max_new_tokens=3), beta=4.0)
    assert pairs.tokens == labels.tokens and len(pairs.tokens) <= 3
    assert pairs.trace.heads == [(1, 0), (2, 3)]
    by_keyword = generate(tiny_llama, "hello", method="dysco", heads=[(1, 0), (2, 3)], beta=4.0, max_new_tokens=3)
    assert by_keyword.tokens == pairs.tokens and by_keyword.method == "dysco"
