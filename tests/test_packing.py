"""Packed projections: the loader puts each layer's q/k/v (and gate/up) weights in one tensor
without changing a value or adding memory, and the written-out decoder's one product over them
gives what one product per projection gives."""

import pytest
import torch

from dysco_interp.decoding.backends.fused_decoder import DecodePass, FusedDecoder
from dysco_interp.decoding.backends.slot_cache import SlotCache, capacity_for
from dysco_interp.models.loaded import from_hf
from dysco_interp.models.packing import GROUPS, Packed, pack_group, pack_projections, packed, projections
from dysco_interp.models.tiny import STYLES, tiny_hf_model


def storages_bytes(module: torch.nn.Module) -> int:
    seen = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in module.parameters()}
    return sum(seen.values())


@pytest.mark.parametrize("style", STYLES)
def test_the_loader_packs_every_layer_keeping_values_and_memory(style):
    hf, tokenizer = tiny_hf_model(style)
    before = {name: p.detach().clone() for name, p in hf.named_parameters()}
    n_bytes = storages_bytes(hf)
    model = from_hf(hf, tokenizer, f"tiny-{style}")
    assert {name: p for name, p in model.prefill_model.named_parameters()}.keys() == before.keys()
    for name, p in model.prefill_model.named_parameters():
        assert torch.equal(p, before[name]), name
    assert storages_bytes(model.prefill_model) == n_bytes
    for layer in model.prefill_model.model.layers:
        for group in GROUPS:
            modules = projections(layer, group)
            assert modules is not None
            whole = packed([m.weight for m in modules])
            assert whole is not None
            assert torch.equal(whole, torch.cat([m.weight for m in modules]))
            if modules[0].bias is not None:  # Qwen2's query, key and value biases
                assert packed([m.bias for m in modules]) is not None


def test_the_bridge_and_the_twins_read_the_packed_memory(tiny_llama):
    hf_layer = tiny_llama.prefill_model.model.layers[0].self_attn
    q, k = hf_layer.q_proj.weight, hf_layer.k_proj.weight
    eager = tiny_llama.bridge.original_model.model.layers[0].self_attn
    assert eager.q_proj.weight.data_ptr() == q.data_ptr()
    assert k.data_ptr() == q.data_ptr() + q.numel() * q.element_size()


def test_a_packed_model_saves_and_loads_as_it_was(tiny_llama, tmp_path):
    from transformers import AutoModelForCausalLM

    tiny_llama.prefill_model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    saved = again.state_dict()
    for name, value in tiny_llama.prefill_model.state_dict().items():
        assert torch.equal(saved[name], value), name


def test_packing_refuses_what_it_cannot_pack():
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 2, bias=False)
    assert not pack_group([a, b])  # a bias on one only
    c = torch.nn.Linear(4, 2).to(torch.float64)
    assert not pack_group([a, c])  # mixed dtypes
    assert packed([a.weight, c.weight]) is None
    d = torch.nn.Linear(4, 2)
    assert pack_group([a, d])
    assert packed([a.weight, d.weight]) is not None
    assert packed([d.weight, a.weight]) is None  # not in the packed order
    assert Packed([]).found() is None  # a layer without the group


def test_a_replaced_weight_is_noticed_and_read_as_it_now_is():
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 2)
    pack_group([a, b])
    packs = Packed([a, b])
    assert packs.found() is not None
    b.weight = torch.nn.Parameter(torch.ones(2, 4))
    assert packs.found() is None
    pack_group([a, b])  # packed again, at a new address
    weight, bias = packs.found()
    assert torch.equal(weight[3:], torch.ones(2, 4))


@pytest.mark.parametrize("style", ["llama", "qwen2", "qwen3"])
def test_the_decoder_gives_the_same_cache_and_logits_packed_or_not(style):
    """One prefill and one decoding pass of the written-out decoder over a packed model and over
    the same weights unpacked (float32, CPU): equal up to float32 rounding of the products."""
    results = []
    for pack in (True, False):
        hf, _ = tiny_hf_model(style)
        if pack:
            pack_projections(hf.model.layers)
        decoder = FusedDecoder(hf)
        assert all((p.found() is not None) == pack for packs in decoder.packs for p in packs)
        ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(0))
        cache = SlotCache(len(decoder.layers), capacity_for(ids.shape[1] + 1))
        with torch.inference_mode():
            decoder.prefill(ids[:, :8], cache.update, chunk_size=4)
            mask = torch.full((2, 1, 1, cache.capacity), -torch.inf)
            mask[..., :9] = 0.0
            step = DecodePass(mask, torch.tensor([8]))
            x, normed = decoder.decode(decoder.embed(ids[:, 8:]), torch.full((2, 1), 8), cache.buffers, step)
            results.append((decoder.logits(normed), [b[0][:, :, :9].clone() for b in cache.buffers]))
    (logits_a, keys_a), (logits_b, keys_b) = results
    torch.testing.assert_close(logits_a, logits_b, rtol=1e-5, atol=1e-5)
    for a, b in zip(keys_a, keys_b):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_values_do_not_keep_the_packed_output_alive():
    """A prefill chunk's values, a view of the packed q/k/v output, would hold all of it through
    the layer's attention: the values come back as their own tensor."""
    from dysco_interp.decoding.backends.fused_decoder import attention_inputs

    qkv = torch.randn(2, 5, 4 * 8 + 2 * 8 + 2 * 8)
    q, k, v = qkv.split([32, 16, 16], dim=-1)
    cos, sin = torch.ones(2, 5, 8), torch.zeros(2, 5, 8)
    _, _, value = attention_inputs(q, k, v, cos, sin, 8, None, None, 0.0)
    assert value.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()
    torch.testing.assert_close(value, v.view(2, 5, 2, 8).transpose(1, 2))


def test_prefill_compiles_its_pieces_only_from_the_second_prefill_of_a_shape(monkeypatch):
    """A process that prefills once never pays the pieces' compilation; the second prefill of a
    (batch, chunk) shape and every later one run the given kernels for their full chunks."""
    import dataclasses

    from dysco_interp.decoding.backends import fused_decoder
    from dysco_interp.decoding.backends.fused_decoder import EAGER, Kernels

    monkeypatch.setattr(fused_decoder, "PREFILLED", set())
    calls = []

    def spy(fn):
        def run(*args, **kwargs):
            calls.append(args[0].shape[:2])
            return fn(*args, **kwargs)
        return run

    kernels = Kernels(*(spy(getattr(EAGER, f.name)) for f in dataclasses.fields(Kernels) if f.name != "matvec"))
    hf, _ = tiny_hf_model("llama")
    decoder = FusedDecoder(hf, kernels)

    def prefill(batch: int, n: int) -> list:
        calls.clear()
        ids = torch.randint(3, 100, (batch, n), generator=torch.Generator().manual_seed(0))
        cache = SlotCache(len(decoder.layers), capacity_for(n))
        with torch.inference_mode():
            decoder.prefill(ids, cache.update, chunk_size=4)
        return list(calls)

    assert prefill(1, 10) == []  # the first prefill of (1, 4): eager
    assert prefill(1, 10) and all(shape == (1, 4) for shape in prefill(1, 10))  # full chunks only
    assert prefill(2, 8) == []  # a new batch size starts eager again
    assert prefill(1, 3) == []  # no full chunk


def test_a_prefill_chunk_keeps_no_mlp_output_through_the_next_attention(monkeypatch):
    """A chunk's MLP activation and its gate and up output are its largest tensors: neither is
    alive when the next layer's attention runs (their lifetime set the prefill's peak memory on
    a GPU)."""
    import dataclasses
    import weakref

    from dysco_interp.decoding.backends import fused_decoder

    made = []

    def silu_mul(gate, up):
        out = fused_decoder.silu_mul(gate, up)
        made.extend(weakref.ref(t) for t in (out, gate if gate._base is None else gate._base))
        return out

    hf, _ = tiny_hf_model("qwen3")
    pack_projections(hf.model.layers)
    decoder = FusedDecoder(hf, dataclasses.replace(fused_decoder.EAGER, silu_mul=silu_mul))
    chunk = 4
    # the given pieces run from the first prefill of this shape on
    monkeypatch.setattr(fused_decoder, "PREFILLED", {(1, chunk, hf.dtype, torch.device("cpu"))})
    attention = fused_decoder.chunk_attention
    alive = []

    def attend(*args, **kwargs):
        alive.append(sum(ref() is not None for ref in made))
        return attention(*args, **kwargs)

    monkeypatch.setattr(fused_decoder, "chunk_attention", attend)
    ids = torch.randint(3, 100, (1, 3 * chunk), generator=torch.Generator().manual_seed(0))
    cache = SlotCache(len(decoder.layers), capacity_for(ids.shape[1]))
    with torch.inference_mode():
        decoder.prefill(ids, cache.update, chunk_size=chunk)
    assert len(made) == 2 * 3 * len(decoder.layers)  # every chunk's every layer went through the spy
    assert alive == [0] * (3 * len(decoder.layers))
