"""Small conveniences: a one-line LoadedModel repr, HeadSet JSON text, saving generation results,
and `load_model(progress=False)` printing nothing."""

import json

import pytest

from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import generate, generate_batch
from dysco_interp.decoding.results import GenerationResult
from dysco_interp.errors import DataError
from dysco_interp.heads.errors import HeadFileError
from dysco_interp.heads.formats import load_heads
from dysco_interp.heads.headset import HeadSet


def heads_for(model, pairs=((1, 0), (2, 3), (1, 2))):
    s = model.spec
    return HeadSet(list(pairs), model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads,
                   scores=[0.5, 0.25, 0.125])


# ---- LoadedModel repr


def test_repr_is_one_short_line(tiny_of):
    model = tiny_of("llama")
    s = model.spec
    text = repr(model)
    assert "\n" not in text and len(text) < 200, text
    assert text.startswith("LoadedModel(")
    assert f"{s.n_layers} layers x {s.n_heads} heads ({s.n_kv_heads} kv)" in text
    assert repr(s.name) in text and s.architecture in text
    assert "float32" in text and "cpu" in text and f"context {s.context_length}" in text


# ---- HeadSet.to_json without a path


def test_headset_to_json_text_matches_file_and_round_trips(tiny_of, tmp_path):
    model = tiny_of("llama")
    hs = heads_for(model)
    text = hs.to_json()
    assert isinstance(text, str)
    path = hs.to_json(tmp_path / "heads.json")
    assert path == tmp_path / "heads.json"
    assert path.read_text(encoding="utf-8") == text
    assert json.loads(text)["heads"][1] == {"layer": 2, "head": 3, "label": "L2H3", "score": 0.25}
    for back in (HeadSet.from_json_text(text), HeadSet.from_json_text(text, spec=model.spec),
                 HeadSet.from_json(path), load_heads(json.loads(text), model.spec)):
        assert back.heads == hs.heads and back.scores == hs.scores and back.model == hs.model


def test_headset_from_json_text_rejects_bad_text():
    with pytest.raises(HeadFileError, match="<JSON text>: not valid JSON"):
        HeadSet.from_json_text("{not json")


# ---- GenerationResult save/load


def _same(a: GenerationResult, b: GenerationResult) -> None:
    assert a == b  # dataclass equality: text, tokens, timings, trace steps, forced scores


def test_generation_result_round_trips(tiny_of, tmp_path):
    model = tiny_of("llama")
    result = generate(model, "The capital of France is", DecodingConfig(max_new_tokens=4), heads=heads_for(model))
    assert result.trace is not None and result.trace.decode_steps() and result.forced is None
    d = result.to_dict()
    json.dumps(d)  # JSON-ready
    _same(GenerationResult.from_dict(d), result)
    path = result.save(tmp_path / "sub" / "result.json")
    assert path.exists() and not list(path.parent.glob(".*.tmp"))
    back = GenerationResult.load(path)
    _same(back, result)
    assert back.trace.heads == result.trace.heads and isinstance(back.trace.heads[0], tuple)
    assert back.timings.decode_s == result.timings.decode_s  # exact, not rounded


def test_teacher_forced_result_round_trips(tiny_of, tmp_path):
    model = tiny_of("llama")
    out = generate_batch(model, ["Question: what is two plus two? Answer:"],
                         {"dysco": DecodingConfig(max_new_tokens=4)}, heads_for(model), forced=["four"])
    result = out["dysco"][0]
    assert result.forced is not None and len(result.forced.logprob) > 0
    back = GenerationResult.load(result.save(tmp_path / "forced.json"))
    _same(back, result)
    assert back.forced.logprob == result.forced.logprob and back.forced.argmax == result.forced.argmax


def test_generation_result_load_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        GenerationResult.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("\x80not json at all", encoding="latin-1")
    with pytest.raises(DataError, match="not a JSON generation result|cannot read"):
        GenerationResult.load(bad)
    bad.write_bytes(b"\x80\x04\x95pickle")
    with pytest.raises(DataError):
        GenerationResult.load(bad)
    heads = tmp_path / "heads.json"
    HeadSet([(0, 0)], method="manual").to_json(heads)
    with pytest.raises(DataError, match="not a saved generation result"):
        GenerationResult.load(heads)
    with pytest.raises(DataError, match="not a saved generation result"):
        GenerationResult.from_dict([1, 2])
    with pytest.raises(DataError, match="malformed"):
        GenerationResult.from_dict({"format": "dysco-interp/generation-result", "format_version": 1})


# ---- load_model(progress=False) is silent


def test_tiny_load_without_progress_prints_nothing(capfd):
    from dysco_interp import load_model

    load_model("tiny-llama", device="cpu", progress=False)
    out, err = capfd.readouterr()
    assert out == "" and "Loading weights" not in err and "%|" not in err, (out, err)


@pytest.mark.real_model
def test_packaged_load_without_progress_prints_no_bar(capfd):
    from transformers.utils import logging as hf_logging

    from dysco_interp import load_model

    before = hf_logging.is_progress_bar_enabled()
    load_model("smollm2-135m", device="cpu", progress=False)
    out, err = capfd.readouterr()
    assert "Loading weights" not in err and "%|" not in err, err[-500:]
    assert out == ""
    assert hf_logging.is_progress_bar_enabled() == before  # restored
