"""HeadSet: construction, views, our JSON format, public-format importers, random heads."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from dysco_interp import __version__
from dysco_interp.errors import ConfigError, DyscoError
from dysco_interp.heads import (
    FORMAT,
    FORMAT_VERSION,
    Geometry,
    HeadFileError,
    HeadModelMismatchError,
    HeadSet,
    HeadSetError,
    available_shipped_heads,
    geometry_of,
    load_heads,
    normalize_model_id,
    paper_heads,
    parse_head_label,
    random_heads,
    random_like,
    shipped_heads,
)
from dysco_interp.models import ModelSpec

DATA = Path(__file__).parent / "data" / "heads"
BAD = DATA / "bad"

QWEN3_8B_TOP5 = [(21, 31), (21, 18), (20, 15), (22, 4), (21, 11)]


def make_spec(name: str, n_layers: int, n_heads: int, n_kv_heads: int) -> ModelSpec:
    return ModelSpec(
        name=name,
        architecture="LlamaForCausalLM",
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_head=16,
        d_model=16 * n_heads,
        context_length=2048,
        layer_types=("full_attention",) * n_layers,
        sliding_window=None,
        chat_template=None,
    )


TINY = make_spec("tiny-llama", 4, 4, 2)
QWEN3_8B = make_spec("Qwen/Qwen3-8B", 36, 32, 8)


def sample_set(**changes) -> HeadSet:
    base = dict(
        heads=[(2, 3), (3, 0), (1, 1)],
        scores=[0.625, 0.5, 0.125],
        model="tiny-llama",
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        method="qrscore",
        data="needle_qa synthetic",
        n_examples=32,
        seed=7,
        command="dysco-interp detect-heads tiny-llama",
        extra={"null_query": "N/A"},
    )
    base.update(changes)
    return HeadSet(**base)


# --------------------------------------------------------------------------- the HeadSet object


def test_headset_views():
    hs = sample_set()
    assert len(hs) == 3
    assert list(hs) == [(2, 3), (3, 0), (1, 1)]
    assert (3, 0) in hs and (0, 0) not in hs
    assert hs.labels() == ["L2H3", "L3H0", "L1H1"]
    assert hs.layers == (1, 2, 3)
    assert hs.max_layer == 3
    assert hs.by_layer() == {1: [1], 2: [3], 3: [0]}
    assert hs.package_version == __version__
    assert hs.geometry == Geometry("tiny-llama", 4, 4, 2)


def test_headset_normalises_input_types():
    hs = HeadSet([[1, 2], (torch.tensor(0), 3)], scores=[torch.tensor(0.5), 1])
    assert hs.heads == ((1, 2), (0, 3))
    assert hs.scores == (0.5, 1.0)
    assert all(type(x) is int for h in hs.heads for x in h)
    hash(hs)  # frozen: usable as a dict key although `extra` is a dict


def test_headset_is_frozen():
    hs = sample_set()
    with pytest.raises(dataclasses.FrozenInstanceError):
        hs.heads = ((0, 0),)


def test_as_tensor_and_mask():
    hs = sample_set()
    assert hs.as_tensor().tolist() == [[2, 3], [3, 0], [1, 1]]
    m = hs.mask()
    assert m.dtype == torch.bool and m.shape == (4, 4)
    assert sorted(map(tuple, m.nonzero().tolist())) == [(1, 1), (2, 3), (3, 0)]
    assert hs.mask(6, 5).shape == (6, 5)
    with pytest.raises(HeadSetError, match="out of range"):
        hs.mask(3, 4)
    with pytest.raises(ConfigError, match="no geometry"):
        HeadSet([(0, 1)]).mask()


def test_top_and_sort():
    hs = sample_set()
    t = hs.top(2)
    assert t.heads == ((2, 3), (3, 0)) and t.scores == (0.625, 0.5)
    assert t.method == "qrscore" and t.seed == 7 and t.extra["top_k_of"] == 3
    with pytest.raises(ConfigError):
        hs.top(0)
    with pytest.raises(ConfigError):
        hs.top(4)
    shuffled = HeadSet([(0, 0), (0, 1), (0, 2)], scores=[0.1, 0.9, 0.1])
    assert shuffled.sorted_by_score().heads == ((0, 1), (0, 0), (0, 2))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(heads=[]), "at least one head"),
        (dict(heads=[(0, 1), (0, 1)]), "duplicate head L0H1"),
        (dict(heads=[(-1, 0)]), ">= 0"),
        (dict(heads=[(0, True)]), "integer"),
        (dict(heads=[(0, 1.0)]), "integer"),
        (dict(heads=[(0, 1, 2)]), "2 elements"),
        (dict(heads=[(0, 1)], scores=[0.1, 0.2]), "2 scores for 1 heads"),
        (dict(heads=[(0, 1)], scores=[float("nan")]), "finite"),
        (dict(heads=[(4, 0)], n_layers=4, n_heads=4), "L4H0 is out of range"),
        (dict(heads=[(0, 1)], n_layers=4), "both n_layers and n_heads"),
        (dict(heads=[(0, 1)], n_layers=4, n_heads=4, n_kv_heads=3), "multiple of n_kv_heads"),
        (dict(heads=[(0, 1)], method=""), "method"),
        (dict(heads=[(0, 1)], seed=-3), "seed"),
        (dict(heads="L0H1"), "sequence"),
    ],
)
def test_headset_rejects_invalid(kwargs, message):
    with pytest.raises(HeadSetError, match=message):
        HeadSet(**kwargs)


def test_errors_are_dysco_value_errors():
    assert issubclass(HeadFileError, HeadSetError)
    assert issubclass(HeadModelMismatchError, HeadSetError)
    assert issubclass(HeadSetError, DyscoError) and issubclass(HeadSetError, ValueError)


@pytest.mark.parametrize(
    "label, head",
    [("16-3", (16, 3)), ("L16H3", (16, 3)), ("(16, 3)", (16, 3)), (" 0-0 ", (0, 0)), ("(21,31)", (21, 31))],
)
def test_parse_head_label(label, head):
    assert parse_head_label(label) == head


@pytest.mark.parametrize("label", ["3_4", "16-", "L16", "16-3-1", "a-b", "", "16 3", "[16, 3]"])
def test_parse_head_label_rejects(label):
    with pytest.raises(HeadSetError, match="bad head label"):
        parse_head_label(label)


def test_parse_head_label_negative():
    with pytest.raises(HeadSetError, match="negative"):
        parse_head_label("-1-3")


# --------------------------------------------------------------------------- our JSON format


def test_json_round_trip_exact(tmp_path):
    hs = sample_set(scores=[0.1 + 0.2, 1 / 3, -2.5e-17])  # floats that need repr precision
    path = hs.to_json(tmp_path / "sub" / "heads.json")
    back = HeadSet.from_json(path)
    assert back == hs
    assert back.scores == hs.scores and back.extra == hs.extra and back.command == hs.command
    # The file itself is our format, stable under a second write.
    raw = json.loads(path.read_text())
    assert raw["format"] == FORMAT and raw["format_version"] == FORMAT_VERSION
    assert raw["heads"][0] == {"layer": 2, "head": 3, "label": "L2H3", "score": 0.1 + 0.2}
    assert back.to_json(tmp_path / "again.json").read_text() == path.read_text()
    assert not list(path.parent.glob("*.tmp"))  # atomic write left nothing behind


def test_json_round_trip_without_scores_or_geometry(tmp_path):
    hs = HeadSet([(5, 1), (0, 0)], method="manual")
    back = HeadSet.from_json(hs.to_json(tmp_path / "h.json"))
    assert back == hs and back.scores is None and back.geometry is None


def test_dict_round_trip():
    hs = sample_set()
    assert HeadSet.from_dict(hs.to_dict()) == hs


def test_read_our_fixture():
    hs = HeadSet.from_json(DATA / "ours_tiny_llama.json", spec=TINY)
    assert hs.heads == ((2, 3), (3, 0), (1, 1))
    assert hs.scores == (0.625, 0.5, 0.125)
    assert (hs.model, hs.n_layers, hs.n_heads, hs.n_kv_heads) == ("tiny-llama", 4, 4, 2)
    assert (hs.method, hs.n_examples, hs.seed, hs.package_version) == ("qrscore", 32, 7, "0.1.0")
    assert hs.extra == {"null_query": "N/A", "calibrated": True}
    assert load_heads(DATA / "ours_tiny_llama.json") == hs  # sniffed


def test_our_fixture_on_tiny_model(tiny_llama):
    hs = load_heads(DATA / "ours_tiny_llama.json", spec=tiny_llama, allow_other_model=True)
    assert hs.validate_for(tiny_llama.spec, allow_other_model=True) is hs


def _corrupt(tmp_path, **changes) -> Path:
    d = sample_set().to_dict()
    for k, v in changes.items():
        if v is ...:
            del d[k]
        else:
            d[k] = v
    path = tmp_path / "corrupt.json"
    path.write_text(json.dumps(d))
    return path


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(format="other"), "'format' must be"),
        (dict(format_version=99), "newer"),
        (dict(format_version="1"), "format_version"),
        (dict(format_version=0), "'format_version' must be 1 or more, got 0"),
        (dict(format_version=-1), "'format_version' must be 1 or more, got -1"),
        (dict(format_version=True), "'format_version' must be an integer"),
        (dict(heads=...), "missing field"),
        (dict(heads=[]), "empty"),
        (dict(heads="L2H3"), "'heads' must be a list"),
        (dict(heads=[[2, 3]]), r"heads\[0\] must be an object"),
        (dict(heads=[{"layer": 2, "head": 3, "label": "L3H2"}]), "disagrees"),
        (dict(heads=[{"layer": 2, "head": "3"}]), "integer"),
        (dict(heads=[{"layer": 2, "head": 3, "score": 0.5}, {"layer": 1, "head": 0}]), "every head"),
        (dict(heads=[{"layer": 2, "head": 3}, {"layer": 2, "head": 3}]), "duplicate head"),
        (dict(heads=[{"layer": 9, "head": 3}]), "out of range"),
        (dict(n_layers="4"), "n_layers"),
        (dict(typo_field=1), "unknown field"),
        (dict(extra=[1]), "'extra' must be an object"),
    ],
)
def test_our_format_rejects(tmp_path, changes, message):
    path = _corrupt(tmp_path, **changes)
    with pytest.raises(HeadFileError, match=message) as err:
        HeadSet.from_json(path)
    assert str(path) in str(err.value)  # the error names the file


def test_our_format_rejects_non_json(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(HeadFileError, match="not valid JSON"):
        HeadSet.from_json(path)
    with pytest.raises(HeadFileError, match="not found"):
        HeadSet.from_json(tmp_path / "missing.json")


def test_model_mismatch_geometry(tmp_path):
    path = sample_set(model="qwen2.5-coder-1.5b", n_layers=28, n_heads=12, n_kv_heads=2).to_json(
        tmp_path / "h.json"
    )
    other = make_spec("qwen2.5-coder-0.5b", 24, 14, 2)
    with pytest.raises(HeadModelMismatchError) as err:
        HeadSet.from_json(path, spec=other)
    msg = str(err.value)
    assert "made for model qwen2.5-coder-1.5b (28 layers x 12 heads" in msg
    assert "loaded model is qwen2.5-coder-0.5b (24 layers x 14 heads" in msg
    assert str(path) in msg
    # Geometry mismatches are never waived.
    with pytest.raises(HeadModelMismatchError):
        HeadSet.from_json(path, spec=other, allow_other_model=True)


def test_model_mismatch_name_same_geometry():
    hs = sample_set(model="some-other-model")
    with pytest.raises(HeadModelMismatchError, match="allow_other_model"):
        hs.validate_for(TINY)
    assert hs.validate_for(TINY, allow_other_model=True) is hs
    # Hub names, aliases and folders of the same model match loosely.
    assert sample_set(model="/models/Tiny-Llama-Instruct/").validate_for(TINY)
    assert normalize_model_id("Qwen/Qwen2.5-Coder-0.5B-Instruct") == "qwen2.5-coder-0.5b"


def test_validate_for_kv_mismatch_and_range():
    with pytest.raises(HeadModelMismatchError, match="4 KV heads.*loaded model is tiny-llama .*2 KV heads"):
        sample_set(n_kv_heads=4).validate_for(TINY)
    with pytest.raises(HeadSetError, match="L5H0 is out of range"):
        HeadSet([(5, 0)]).validate_for(TINY)
    assert HeadSet([(3, 3)]).validate_for((4, 4)).heads == ((3, 3),)


# --------------------------------------------------------------------------- importers


def test_qrhead_json_fixture():
    hs = load_heads(DATA / "qrhead_scores.json")
    assert hs.heads == ((21, 31), (21, 18), (20, 15), (22, 4), (0, 0))
    assert hs.scores == (0.5125, 0.4875, 0.4375, 0.25, -0.03125)
    assert hs.method == "imported:qrhead-json"
    assert hs.extra["source_file"] == "qrhead_scores.json"
    assert hs.geometry is None
    assert load_heads(DATA / "qrhead_scores.json", fmt="qrhead-json") == hs


def test_qrhead_json_with_spec_and_top_k():
    hs = load_heads(DATA / "qrhead_scores.json", spec=QWEN3_8B, top_k=3)
    assert hs.heads == ((21, 31), (21, 18), (20, 15))
    assert hs.scores == (0.5125, 0.4875, 0.4375)
    assert (hs.model, hs.n_layers, hs.n_heads, hs.n_kv_heads) == ("Qwen/Qwen3-8B", 36, 32, 8)


def test_qrhead_yaml_config_fixture():
    hs = load_heads(DATA / "qrhead_config.yaml")
    assert list(hs) == QWEN3_8B_TOP5
    assert hs.scores is None
    assert hs.model == "Qwen/Qwen3-8B"
    # Hub name in the file matches the spec's name loosely.
    assert load_heads(DATA / "qrhead_config.yaml", spec=make_spec("qwen3-8b", 36, 32, 8)).heads == hs.heads
    with pytest.raises(HeadModelMismatchError):
        load_heads(DATA / "qrhead_config.yaml", spec=make_spec("llama-3.1-8b", 36, 32, 8))


def test_qrhead_plain_string_fixture_and_literal():
    assert list(load_heads(DATA / "qrhead_string.yaml")) == [(16, 3), (20, 14), (17, 2)]
    assert list(load_heads("16-3,20-14, 17-2")) == [(16, 3), (20, 14), (17, 2)]


def test_qrhead_model_map_fixture():
    with pytest.raises(HeadFileError, match="pass spec="):
        load_heads(DATA / "qrhead_models.yaml")
    hs = load_heads(DATA / "qrhead_models.yaml", spec=TINY)
    assert list(hs) == [(2, 3), (3, 0), (1, 1)]
    assert (hs.model, hs.n_layers) == ("tiny-llama", 4)
    assert list(load_heads(DATA / "qrhead_models.yaml", spec=QWEN3_8B)) == QWEN3_8B_TOP5[:3]


def test_qrhead_full_heads_refused():
    with pytest.raises(HeadFileError, match="full_heads"):
        load_heads({"attn_head_set": "full_heads", "model_base_class": "Qwen3-8B"})


def test_dysco_yaml_fixture():
    hs = load_heads(DATA / "dysco_heads.yaml")
    assert list(hs) == [(21, 31), (21, 18), (20, 15), (22, 4), (24, 13)]
    assert hs.method == "imported:dysco-yaml" and hs.scores is None
    assert hs.max_layer == 24


def test_dysco_yaml_string_tuples_fixture():
    assert list(load_heads(DATA / "dysco_heads_strings.yaml")) == [(21, 31), (21, 18), (20, 15)]


def test_dysco_yaml_mapping_forms():
    assert list(load_heads({"heads": [[1, 2], [0, 3]]})) == [(1, 2), (0, 3)]
    assert list(load_heads({"tiny-llama": [[1, 2]], "other": [[3, 3]]}, spec=TINY)) == [(1, 2)]


def test_retrieval_head_fixture():
    hs = load_heads(DATA / "retrieval_head.json")
    # Means: 1-2 0.75, 2-3 0.5, 0-1 0.25, 3-1 0.25 (tie keeps file order), 0-0 0.
    assert hs.heads == ((1, 2), (2, 3), (0, 1), (3, 1), (0, 0))
    assert hs.scores == (0.75, 0.5, 0.25, 0.25, 0.0)
    assert hs.n_examples == 4
    assert hs.method == "imported:retrieval-head-json"
    top = load_heads(DATA / "retrieval_head.json", spec=TINY, top_k=2)
    assert top.heads == ((1, 2), (2, 3)) and top.n_layers == 4


def test_import_out_of_range_with_spec():
    with pytest.raises(HeadSetError, match="L21H31 is out of range for tiny-llama"):
        load_heads(DATA / "dysco_heads.yaml", spec=TINY)
    with pytest.raises(HeadSetError, match="out of range"):
        load_heads(DATA / "retrieval_head.json", spec=make_spec("tiny-llama", 3, 4, 2))


@pytest.mark.parametrize(
    "name, message",
    [
        ("bad_label.json", "bad head label '3_4'"),
        ("negative_index.yaml", "entry #1 layer must be >= 0"),
        ("duplicate_head.json", "duplicate head L2H1"),
        ("wrong_type.json", "scores of '2-1' must be a list"),
        ("wrong_top_level.json", "unrecognised head file content"),
        ("empty.json", "empty head list"),
        ("python_tuple.yaml", "python-specific tags"),
        ("duplicate_key.json", "duplicate key '2-1'"),
        ("nan_score.json", "NaN"),
        ("float_index.yaml", "must be an integer"),
        ("triple.yaml", "2 elements"),
        ("empty_entry.json", "empty entry"),
    ],
)
def test_malformed_files(name, message):
    path = BAD / name
    with pytest.raises(HeadFileError, match=message) as err:
        load_heads(path)
    assert str(path) in str(err.value)


def test_yaml_python_tags_are_not_executed(tmp_path):
    marker = tmp_path / "executed"
    path = tmp_path / "evil.yaml"
    path.write_text(f'- !!python/object/apply:os.makedirs ["{marker}"]\n')
    with pytest.raises(HeadFileError, match="safe YAML"):
        load_heads(path)
    assert not marker.exists()


def test_yaml_duplicate_keys_refused(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text('tiny-llama: "1-1"\ntiny-llama: "2-2"\n')
    with pytest.raises(HeadFileError, match="duplicate key"):
        load_heads(path)


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("name, text, message", [
    ("deep.json", DEEP, "values nest more than 32 levels deep"),
    ("deep.yaml", DEEP, "values nest more than 32 levels deep"),
    ("deep_block.yaml", "".join("  " * i + "-\n" for i in range(2000)), "values nest more than 32 levels deep"),
    ("deep40.json", "[" * 40 + "]" * 40, "values nest more than 32 levels deep"),
    ("deep_value.json", '{"m": ' + "[" * 5000 + "]" * 5000 + "}", "values nest more than 32 levels deep"),
    ("list_key.yaml", "? [[17, 3]]\n: [[1, 2]]\n", r"unhashable key \[\[17, 3\]\] at line 1, column 3"),
    ("flow_list_key.yaml", "{[17, 3]: x}\n", "unhashable key"),
    ("nested_list_key.yaml", "tiny-llama:\n  ? [1, 2]\n  : x\n", "unhashable key .* at line 2"),
    ("mapping_key.yaml", "? {a: 1}\n: [[1, 2]]\n", "unhashable key"),
    ("lists_of_lists.json", "[[[[1, 2]], 3]]", "entry #0 layer must be an integer, got list"),
    ("huge_entry.json", "[[" + ", ".join(["1"] * 100_000) + "]]", r"got 100000: \[1, 1, 1, 1, 1, 1, \.\.\.\]"),
    ("mixed_keys.yaml", "format: dysco-interp/heads\nformat_version: 1\nmethod: m\npackage_version: '1'\n"
                        "heads: [{layer: 0, head: 0}]\n1: a\n~: b\n", r"unknown field\(s\) \['1', 'None'\]"),
    ("unclosed.yaml", "[1, 2\n", r"not valid safe YAML: expected ',' or '\]', but got '<stream end>' at line 2"),
])
def test_hostile_files_are_one_line_head_file_errors(tmp_path, name, text, message):
    # each used to escape as RecursionError, TypeError, or a YAML message over several lines
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(HeadFileError, match=message) as err:
        load_heads(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value) and len(str(err.value)) < 500


def test_hostile_objects_are_head_set_errors():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(HeadSetError, match="nest more than 32 levels"):
        load_heads(deep)
    with pytest.raises(HeadSetError, match="nest more than 32 levels"):
        HeadSet.from_dict({**sample_set().to_dict(), "extra": {"x": deep}})
    with pytest.raises(HeadSetError, match="must have 2 elements"):
        HeadSet([[[1, 2]]])


def test_wrong_format_forced():
    with pytest.raises(HeadFileError, match="must be an object"):
        load_heads(DATA / "qrhead_scores.json", fmt="retrieval-head-json")
    with pytest.raises(ConfigError, match="unknown head file format"):
        load_heads(DATA / "qrhead_scores.json", fmt="pickle")


def test_load_heads_missing_file_and_headset_passthrough(tmp_path):
    with pytest.raises(HeadFileError, match="not found"):
        load_heads(tmp_path / "nope.yaml")
    with pytest.raises(HeadFileError, match="not found"):
        load_heads("heads/qwen.json")
    hs = sample_set()
    assert load_heads(hs) is hs
    assert load_heads(hs, top_k=1).heads == ((2, 3),)
    with pytest.raises(HeadModelMismatchError):
        load_heads(hs, spec=QWEN3_8B)


# --------------------------------------------------------------------------- random heads


def test_random_heads_deterministic_distinct():
    a = random_heads(16, 36, 32, seed=3)
    assert a == random_heads(16, 36, 32, seed=3)
    assert a != random_heads(16, 36, 32, seed=4)
    assert len(set(a)) == 16
    assert all(0 <= layer < 36 and 0 <= head < 32 for layer, head in a)
    everything = random_heads(16, 4, 4, seed=0)
    assert sorted(everything) == [(layer, head) for layer in range(4) for head in range(4)]


def test_random_heads_exclude():
    excluded = [(0, 2), (0, 3)]
    drawn = random_heads(14, 4, 4, seed=1, exclude=excluded)
    assert len(drawn) == 14 and set(excluded).isdisjoint(drawn)
    with pytest.raises(ConfigError, match="cannot draw 15 distinct heads from 14"):
        random_heads(15, 4, 4, seed=0, exclude=excluded)


def test_random_like():
    paper = paper_heads("qwen3-8b")
    r = random_like(paper, QWEN3_8B, seed=11)
    assert len(r) == len(paper) == 16
    assert r == random_like(paper, QWEN3_8B, seed=11)
    assert r.heads != random_like(paper, QWEN3_8B, seed=12).heads
    assert r.method == "random" and r.seed == 11 and r.scores is None
    assert (r.n_layers, r.n_heads, r.n_kv_heads, r.model) == (36, 32, 8, "Qwen/Qwen3-8B")
    assert r.extra["like_method"] == paper.method
    # Geometry defaults to the head set's own; exclude_original draws only other heads.
    r2 = random_like(paper, seed=11, exclude_original=True)
    assert set(r2.heads).isdisjoint(paper.heads) and len(r2) == 16
    # Tuple geometry works too.
    assert random_like(sample_set(), (4, 4), seed=0).n_layers == 4
    with pytest.raises(ConfigError, match="no geometry"):
        random_like(HeadSet([(0, 0)]), seed=0)


def test_random_like_on_tiny_model(tiny_llama):
    r = random_like(sample_set(), tiny_llama, seed=5)
    assert r.validate_for(tiny_llama.spec) is r
    assert r.model == tiny_llama.spec.name


# --------------------------------------------------------------------------- paper and shipped heads


def test_paper_heads_qwen3_8b():
    hs = paper_heads("qwen3-8b")
    assert hs.labels() == [
        "L21H31", "L21H18", "L20H15", "L22H4", "L21H11", "L20H16", "L21H17", "L19H13",
        "L21H10", "L21H8", "L18H5", "L20H14", "L19H14", "L24H13", "L17H4", "L19H28",
    ]
    assert (hs.n_layers, hs.n_heads, hs.n_kv_heads) == (36, 32, 8)
    assert hs.max_layer == 24  # the partial pass runs 25 of 36 layers, as in the paper
    assert paper_heads("Qwen/Qwen3-8B") == hs
    assert hs.validate_for(QWEN3_8B) is hs
    # Agrees with QRHead's published config string for the same model (fixture prefix).
    assert list(hs)[:5] == list(load_heads(DATA / "qrhead_config.yaml"))
    with pytest.raises(ConfigError, match="known: qwen3-8b"):
        paper_heads("llama-3.1-8b")


def test_shipped_heads_missing_lists_available():
    available = available_shipped_heads()
    assert isinstance(available, list)
    with pytest.raises(HeadFileError, match="no shipped head file for 'no-such-model'; available: "):
        shipped_heads("no-such-model")
    with pytest.raises(ConfigError, match="invalid head-file alias"):
        shipped_heads("../etc/passwd")


def test_geometry_of():
    assert geometry_of(TINY) == Geometry("tiny-llama", 4, 4, 2)
    assert geometry_of((36, 32, 8)) == Geometry(None, 36, 32, 8)
    with pytest.raises(ConfigError):
        geometry_of((1,))
    with pytest.raises(ConfigError):
        geometry_of("qwen3-8b")


@pytest.mark.parametrize(
    "alias,geometry,n_examples",
    [("smollm2-135m", (30, 9, 3), 24), ("qwen2.5-coder-0.5b", (24, 14, 2), 32),
     ("qwen2.5-coder-1.5b", (28, 12, 2), 32)],
)
def test_shipped_head_files_load_with_provenance(alias, geometry, n_examples):
    from dysco_interp.heads import shipped_heads

    heads = shipped_heads(alias)
    assert (heads.n_layers, heads.n_heads, heads.n_kv_heads) == geometry
    assert len(heads) == 16 and heads.method == "qrscore" and heads.n_examples == n_examples
    assert heads.command.startswith("python analyses/ship_heads.py --model " + alias)
    assert list(heads.scores) == sorted(heads.scores, reverse=True)
