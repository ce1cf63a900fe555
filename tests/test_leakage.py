"""A head set records the task instances it was detected on, and a run that tests DySCO on any of
them says so in one line: those results are not held out."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from dysco_interp.cli import main
from dysco_interp.detection.api import detect
from dysco_interp.errors import LeakageWarning
from dysco_interp.heads import HeadSet
from dysco_interp.heads.detected_on import DetectionData, detection_data, leakage_line, ranges
from dysco_interp.heads.errors import HeadSetError
from dysco_interp.heads.shipped import shipped_path
from dysco_interp.models.tiny import tiny_tokenizer
from dysco_interp.tasks import make_dataset, save_dataset

REPO = Path(__file__).resolve().parents[1]


def test_detection_data_groups_instances_by_task_and_seed():
    tokenizer = tiny_tokenizer("llama")
    made = make_dataset("needle_qa", tokenizer, 600, n=3) + make_dataset("needle_qa", tokenizer, 600, n=2, seed=4)
    assert detection_data(made) == (DetectionData("needle_qa", 0, (0, 1, 2), (600,)),
                                    DetectionData("needle_qa", 4, (0, 1), (600,)))
    assert ranges([0, 1, 2, 3, 7, 9, 10]) == "0-3, 7, 9-10"
    # the same indices of the same seed at another length hold the same needles: still leaked
    longer = make_dataset("needle_qa", tokenizer, 900, n=4)
    line = leakage_line(detection_data(made), longer)
    assert line is not None and "3 of 4 are needle_qa seed 0, indices 0-2 at 600 tokens" in line
    assert leakage_line(detection_data(made), make_dataset("needle_qa", tokenizer, 600, n=3, seed=9)) is None


def test_a_head_file_keeps_its_detection_data_and_old_files_still_read(tmp_path):
    hs = HeadSet([(1, 0), (2, 3)], detected_on=(DetectionData("needle_qa", 0, (0, 1), (2048,)),))
    back = HeadSet.from_json(hs.to_json(tmp_path / "h.json"))
    assert back.detected_on == hs.detected_on
    old = json.loads((REPO / "tests" / "data" / "heads" / "ours_tiny_llama.json").read_text())
    assert old["format_version"] == 1 and HeadSet.from_dict(old).detected_on == ()
    bad = {**hs.to_dict(), "detected_on": [{"task": "needle_qa", "seed": -1, "indices": [0], "lengths": [9]}]}
    with pytest.raises(HeadSetError, match="detected_on"):
        HeadSet.from_dict(bad)


@pytest.mark.parametrize("model", ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_the_shipped_heads_say_what_they_were_detected_on(model):
    hs = HeadSet.from_json(REPO / shipped_path(model))
    assert [(d.task, d.seed, d.n) for d in hs.detected_on] == [("needle_qa", 0, hs.n_examples)]


def test_detection_records_its_instances(tiny_llama):
    result = detect(tiny_llama, n=2, length=600, seed=3, progress=False, heads=[(1, 0), (2, 3)])
    assert result.headset(1).detected_on == (DetectionData("needle_qa", 3, (0, 1), (600,)),)


@pytest.fixture(scope="module")
def needles(tmp_path_factory):
    d = tmp_path_factory.mktemp("leak")
    tokenizer = tiny_tokenizer("llama")
    for seed in (0, 7):
        (d / f"seed{seed}").mkdir()
        made = make_dataset("needle_qa", tokenizer, 600, n=2, seed=seed)
        save_dataset(d / f"seed{seed}" / "needle_qa_600.jsonl", made)
    detected = (DetectionData("needle_qa", 0, (0, 1, 2), (600,)),)
    heads = HeadSet([(1, 0), (2, 3)], model="tiny-llama", detected_on=detected)
    heads.to_json(d / "heads.json")
    return d


@pytest.mark.parametrize("seed,warned", [(0, True), (7, False)])
def test_evaluate_warns_in_one_line_when_the_test_set_is_the_detection_set(needles, tmp_path, capsys, seed, warned):
    argv = ["evaluate", "--model", "tiny-llama", "--task", "needle_qa", "--data", str(needles / f"seed{seed}"),
            "--methods", "vanilla,dysco", "--heads", str(needles / "heads.json"), "--max-new-tokens", "2",
            "--out", str(tmp_path / "r.jsonl"), "--allow-other-model"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "warning" in line]
    if warned:
        assert len(lines) == 1 and lines[0].startswith("dysco-interp: warning: the QRHeads were detected on"), err
        assert "2 of 2 are needle_qa seed 0, indices 0-2" in lines[0]
    else:
        assert not lines, err


def test_vanilla_alone_is_no_leak(tiny_llama):
    from dysco_interp.decoding.config import DecodingConfig
    from dysco_interp.experiments.evaluate import warn_leakage

    inst = make_dataset("needle_qa", tiny_tokenizer("llama"), 600, n=1)
    heads = HeadSet([(1, 0)], detected_on=(DetectionData("needle_qa", 0, (0,), (600,)),))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_leakage(heads, inst, {"vanilla": DecodingConfig(method="vanilla")})
        with pytest.raises(LeakageWarning):
            warn_leakage(heads, inst, {"dysco": DecodingConfig(method="dysco")})


def test_an_instance_id_gives_back_its_origin():
    from dysco_interp.tasks.base import Origin, instance_origin

    made = make_dataset("needle_qa", tiny_tokenizer("llama"), 600, n=2, seed=5)
    assert [instance_origin(x.id) for x in made] == [Origin("needle_qa", 5, 0), Origin("needle_qa", 5, 1)]
    assert instance_origin("my own id") is None


def test_the_paper_regime_tables_flag_cells_the_heads_were_detected_on():
    from dysco_interp.studies.paper_regime_report import not_held_out

    records = [{"model": "qwen2.5-coder-1.5b", "length": 130048, "id": f"needle_qa-s0-{i}-130048t"} for i in range(3)]
    records += [{"model": "qwen2.5-coder-1.5b", "length": 31744, "id": f"needle_qa-s2-{i}-31744t"} for i in range(3)]
    assert not_held_out(records) == ["- qwen2.5-coder-1.5b, 127K YaRN: 3 of 3 instances are needle_qa seed 0, "
                                     "indices 0-31 at 2048 tokens"]
