"""A model split by layers over two devices decodes as it does on one.

With two GPUs the split is over cuda:0 and cuda:1; elsewhere over ("cpu", "cpu"), whose two
parts run every boundary of a real split (the residual stream handed on, the fixed decoding
tensors copied, one graph segment per part) on one machine.
"""

import pytest
import torch

from dysco_interp import load_model
from dysco_interp.decoding import backends
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import compare_methods, generate_batch
from dysco_interp.decoding.plan import PassPlan
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models.loaded import split
from dysco_interp.models.placement import Placement, materialize, parse_devices
from dysco_interp.models.tiny import STYLES, tiny_config, tiny_model

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
DEVICES = ("cuda:0", "cuda:1") if TWO_GPUS else ("cpu", "cpu")
ONE = DEVICES[0]
# layers (0, 0 | 1, 1): the deepest QRHead after the boundary, or exactly at its end
HEADS = {"crossing": ((1, 0), (2, 3), (1, 2)), "at the boundary": ((0, 1), (1, 3))}
PROMPT = "The ferry leaves Bergen at noon. " * 5 + "Trains run from Oslo to Bergen. " * 4 + "How to reach Bergen?"
OTHERS = ["Lisbon is sunny. " * 4 + "Which city is sunny?", "Kyiv, Lviv and Odesa have trains. " * 7 + "Name one."]
N_NEW = 10
SELECTING = dict(params={"beta": 4.0, "select_p": 0.7}, max_new_tokens=N_NEW, record_positions=True)
METHODS = {
    "vanilla": DecodingConfig(method="vanilla", max_new_tokens=N_NEW),
    "dysco": DecodingConfig(**SELECTING),
    "reuse": DecodingConfig(method="dysco-reuse", **SELECTING),
    "static": DecodingConfig(method="dysco-static", **SELECTING),
    "uniattns": DecodingConfig(method="uniattns", params={"tau": 0.5}, max_new_tokens=N_NEW),
}


def heads_for(model, pairs=HEADS["crossing"]):
    s = model.spec
    return HeadSet(list(pairs), model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def selections(result):
    return [(s.position, s.selected, s.n_selected) for s in result.trace.steps]


def pair(style):
    """The same tiny model (same seed) on one device and split over two."""
    return tiny_model(style, device=ONE), split(tiny_model(style, device=ONE), DEVICES)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("backend", ["bridge", "sdpa", "static"])
def test_a_split_model_gives_the_one_device_tokens_and_selections(style, backend):
    whole, halves = pair(style)
    assert halves.layout.parts == (0, 0, 1, 1)
    for name, pairs in HEADS.items():
        one = compare_methods(whole, PROMPT, METHODS, heads_for(whole, pairs), backend=backend)
        two = compare_methods(halves, PROMPT, METHODS, heads_for(halves, pairs), backend=backend)
        for method in METHODS:
            assert two[method].tokens == one[method].tokens, (name, method)
            assert selections(two[method]) == selections(one[method]), (name, method)


@pytest.mark.parametrize("backend", ["sdpa", "static"])
def test_a_split_model_decodes_a_padded_batch_as_one_device_does(backend):
    whole, halves = pair("qwen3")
    prompts = [PROMPT, *OTHERS]
    configs = {k: METHODS[k] for k in ("vanilla", "dysco", "reuse")}
    one = generate_batch(whole, prompts, configs, heads_for(whole), backend=backend)
    two = generate_batch(halves, prompts, configs, heads_for(halves), backend=backend)
    for method in configs:
        for a, b in zip(one[method], two[method]):
            assert b.tokens == a.tokens and selections(b) == selections(a), method


def test_each_layers_keys_and_values_live_on_its_device():
    _, halves = pair("llama")
    ids = torch.randint(20, 500, (1, 30), generator=torch.Generator().manual_seed(0))
    for name in ("sdpa", "static"):
        state = backends.make_backend(halves, name).prefill(ids, None)
        for layer in range(halves.spec.n_layers):
            keys = state.cache.keys(layer) if name == "static" else state.cache.layers[layer].keys
            assert keys.device == halves.layout.layer_device(layer)
    logits = backends.make_backend(halves, "static").run(state, ids[:, -1], PassPlan()).logits
    assert logits.device == halves.device  # outputs come back where the inputs went in


def test_transformerlens_hooks_see_each_layer_on_its_device():
    whole, halves = pair("llama")
    ids = torch.randint(20, 500, (1, 12), generator=torch.Generator().manual_seed(2))
    logits, cache = halves.bridge.run_with_cache(ids.to(halves.device))
    one_logits, one_cache = whole.bridge.run_with_cache(ids.to(whole.device))
    torch.testing.assert_close(logits.to(one_logits.device), one_logits)
    for layer in range(halves.spec.n_layers):
        resid = cache[f"blocks.{layer}.hook_resid_post"]
        assert resid.device == halves.layout.layer_device(layer)
        torch.testing.assert_close(resid.to(ONE), one_cache[f"blocks.{layer}.hook_resid_post"])


def test_layers_are_split_into_contiguous_runs_and_segments_follow_them():
    cpu = torch.device("cpu")
    placement = Placement.even([cpu, cpu, cpu], 8)
    assert placement.parts == (0, 0, 0, 1, 1, 1, 2, 2)
    assert placement.segments() == [(0, 0, 3), (1, 3, 6), (2, 6, 8)]
    assert placement.segments(2, 7) == [(0, 2, 3), (1, 3, 6), (2, 6, 7)]
    assert placement.segments(4, 4) == []
    assert not Placement.single(cpu, 4).split
    with pytest.raises(ConfigError, match="at most one per layer"):
        Placement.even([cpu] * 5, 4)


def test_a_tied_unembedding_stays_with_the_embedding():
    whole = tiny_model("llama")  # tiny models tie their embeddings
    cpu = torch.device("cpu")
    mapping = Placement((cpu, torch.device("meta")), (0, 0, 1, 1)).device_map(whole.prefill_model)
    assert mapping["lm_head"] == mapping["model.embed_tokens"] == "cpu"
    assert mapping["model.norm"] == mapping["model.layers.3"] == "meta"
    untied = tiny_config("qwen3", vocab_size=300, tie_word_embeddings=False)
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(untied)
    assert Placement((cpu, torch.device("meta")), (0, 0, 1, 1)).device_map(hf)["lm_head"] == "meta"


@pytest.mark.parametrize("devices, message", [
    ("cpu", "at least two devices"),
    ("cpu,", "at least two devices"),
    ("cpu,mps", "unsupported device type"),
    ("cpu,nonsense:x", "invalid device"),
])
def test_a_bad_split_is_one_clear_error(devices, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse_devices(devices)
    assert "\n" not in str(err.value)


def test_load_model_refuses_a_device_and_a_split_before_loading(monkeypatch):
    from dysco_interp.models import loading

    monkeypatch.setattr(loading, "source_for", lambda name: pytest.fail("loaded before the check"))
    with pytest.raises(ConfigError, match="not both"):
        load_model("tiny-llama", device="cpu", devices="cpu,cpu")
    with pytest.raises(ConfigError, match="at least two"):
        load_model("tiny-llama", devices="cpu")


def test_load_model_splits_and_keeps_the_weights_identity():
    whole = load_model("tiny-qwen2", device=ONE, progress=False)
    halves = load_model("tiny-qwen2", devices=",".join(DEVICES), progress=False)
    assert halves.layout.split and halves.layout.devices == tuple(map(torch.device, DEVICES))
    assert halves.weights_id == whole.weights_id
    one = compare_methods(whole, PROMPT, {"dysco": METHODS["dysco"]}, heads_for(whole), backend="static")
    two = compare_methods(halves, PROMPT, {"dysco": METHODS["dysco"]}, heads_for(halves), backend="static")
    assert two["dysco"].tokens == one["dysco"].tokens


def test_a_random_model_is_made_on_its_devices_and_runs():
    from transformers import AutoModelForCausalLM

    config = tiny_config("qwen3", vocab_size=300, tie_word_embeddings=False)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    placement = Placement.even(parse_devices(",".join(DEVICES)), config.num_hidden_layers)
    materialize(hf, placement)
    for i, layer in enumerate(hf.model.layers):
        assert layer.mlp.up_proj.weight.device == placement.layer_device(i)
    assert 0.1 < hf.model.layers[0].self_attn.q_proj.weight.std() < 0.3  # initialised, not left empty
    ids = torch.randint(0, 300, (1, 9), device=placement.devices[0])
    assert torch.isfinite(hf(ids).logits).all()


def test_graphs_of_a_split_need_the_written_out_decoder():
    halves = split(tiny_model("gemma3", device=ONE), DEVICES)
    if halves.device.type == "cuda":
        with pytest.raises(ConfigError, match="written-out decoder"):
            backends.make_backend(halves, "static", graphs=True)
    static = backends.make_backend(halves, "static")
    assert static.graphs is False and static.decoder is None
    cfg = DecodingConfig(method="vanilla", max_new_tokens=3)
    assert len(compare_methods(halves, PROMPT, {"v": cfg}, backend="static")["v"].tokens) == 3
