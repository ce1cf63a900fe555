"""The table scripts pool several stores only when their records are comparable: records of one
cell computed with other settings (dtype, backend, device, head set, ...), or a record stored
twice with different results, are refused with one line naming the two files and what differs."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from dysco_interp.analysis.records import load_pooled
from dysco_interp.errors import ConfigError
from dysco_interp.studies.budget_report import write_reports
from dysco_interp.studies.overhead import measured

REPO = Path(__file__).resolve().parents[1]
HEADER = {"kind": "dysco-interp-store", "format": 2, "purpose": "evaluate", "created_by": "dysco-interp test"}


def run_script(name: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "analyses" / f"{name}.py"), *argv], capture_output=True,
                          text=True, timeout=600)


def settings(dtype="bfloat16", **extra):
    return {"model": "m", "task": "path_traversal", "dtype": dtype, "device": "cuda", "backend": "static",
            "weights": "w1", **extra}


def record(method="vanilla", index=0, value=1.0, *, store=None, output="route", heads=None, **config):
    store = store if store is not None else settings()
    return {"model": "m", "task": "path_traversal", "length": 1024, "method": method, "seed": 0, "index": index,
            "id": f"pt-{index}", "instance": f"h{index}", "output": output, "finished": True,
            "accuracy": value, "step_accuracy": value, "partial_accuracy": value,
            "timings": {"decode_tok_per_s": 10.0},
            "config": {"method": method, "max_new_tokens": 8, **config}, "backend": store["backend"],
            "settings": {**store, "method": {"method": method, "heads": heads}}}


def write_store(path: Path, store_settings, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({**HEADER, "settings": store_settings})] + [json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_stores_of_another_dtype_are_refused_not_deduplicated(tmp_path):
    bf16, fp32 = settings("bfloat16"), settings("float32")
    write_store(tmp_path / "a_bf16.jsonl", bf16,
                [record("vanilla", i, 0.0, store=bf16, output="wrong") for i in range(2)])
    write_store(tmp_path / "b_fp32.jsonl", fp32, [record("vanilla", i, 1.0, store=fp32) for i in range(2)])
    with pytest.raises(ConfigError) as e:
        load_pooled([str(tmp_path / "*.jsonl")])
    msg = str(e.value)
    assert "\n" not in msg and "a_bf16.jsonl" in msg and "b_fp32.jsonl" in msg and "dtype" in msg


def test_other_settings_in_one_cell_are_refused_even_without_shared_instances(tmp_path):
    # vanilla in bf16 against DySCO in fp32: the paired difference would compare two dtypes
    bf16, fp32 = settings("bfloat16"), settings("float32")
    write_store(tmp_path / "vanilla.jsonl", bf16, [record("vanilla", 0, store=bf16)])
    write_store(tmp_path / "dysco.jsonl", fp32, [record("dysco", 0, store=fp32)])
    with pytest.raises(ConfigError, match="dtype"):
        load_pooled([str(tmp_path / "*.jsonl")])


def test_the_same_method_with_another_head_set_is_refused(tmp_path):
    s = settings()
    write_store(tmp_path / "a.jsonl", s, [record("dysco", 0, store=s, heads=[[1, 2]])])
    write_store(tmp_path / "b.jsonl", s, [record("dysco", 1, store=s, heads=[[3, 4]])])
    with pytest.raises(ConfigError, match="heads"):
        load_pooled([str(tmp_path / "*.jsonl")])


def test_records_from_before_a_method_gained_a_parameter_pool_with_those_at_its_default(tmp_path):
    import dysco_interp.decoding.baselines  # noqa: F401  (registers dysco-sparse)

    s = settings()

    def sparse(index, **options):
        r = record("dysco-sparse", index, store=s)
        r["settings"]["method"]["options"] = {"block": 64, "max_blocks": 64, "sinks": 64,
                                              "sparse_layers": "after-reads", "window": 256, **options}
        return r

    write_store(tmp_path / "a.jsonl", s, [sparse(0)])  # written before `fill_blocks` existed
    write_store(tmp_path / "b.jsonl", s, [sparse(1, fill_blocks=False)])
    assert len(load_pooled([str(tmp_path / "*.jsonl")])[0].records) == 2
    write_store(tmp_path / "b.jsonl", s, [sparse(1, fill_blocks=True)])  # the same key, another setting
    with pytest.raises(ConfigError, match=r"fill_blocks false -> true"):
        load_pooled([str(tmp_path / "*.jsonl")])


def test_a_repeat_with_other_results_is_counted_once_and_said(tmp_path):
    # headerless stores name no dtype, and bf16 GPU decoding is not bitwise repeatable: a repeat
    # whose results differ cannot be refused, but the table must say it kept only one of them
    a, b = record("vanilla", 0, 0.0, output="wrong"), record("vanilla", 0, 1.0, output="route")
    for r in (a, b):
        r.pop("settings")
    (tmp_path / "a.jsonl").write_text(json.dumps(a) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps(b) + "\n")
    pooled, _, _ = load_pooled([str(tmp_path / "*.jsonl")])
    assert (len(pooled.records), pooled.dropped, pooled.differing) == (1, 1, 1)
    note = pooled.notes()[-1]
    assert "/a.jsonl and " in note and "/b.jsonl" in note and "output" in note and "accuracy" in note


def test_a_run_stored_twice_is_still_counted_once_and_other_models_pool(tmp_path):
    s, other = settings(), {**settings(), "model": "n", "weights": "w2", "dtype": "float32"}
    twice = [record("vanilla", i, store=s) for i in range(2)]
    for r in twice[1:]:
        r["timings"] = {"decode_tok_per_s": 99.0}  # timings differ between runs; results do not
    write_store(tmp_path / "a.jsonl", s, twice)
    write_store(tmp_path / "b.jsonl", s, [record("vanilla", i, store=s) for i in range(2)])
    write_store(tmp_path / "c.jsonl", other, [{**record("vanilla", 0, store=other), "model": "n"}])
    pooled, files, unmatched = load_pooled([str(tmp_path / "*.jsonl")])
    assert (len(pooled.records), len(files), unmatched, pooled.dropped, pooled.differing) == (3, 3, [], 2, 0)
    assert pooled.notes() == ["2 repeated records (same method and instance) counted once"]


@pytest.mark.slow
@pytest.mark.parametrize("script", ["pt_table", "ablation_table", "robustness"])
def test_table_scripts_refuse_mixed_settings_in_one_line(tmp_path, script):
    bf16, fp32 = settings("bfloat16"), settings("float32")
    write_store(tmp_path / "s/bf16.jsonl", bf16, [record(m, i, 0.0, store=bf16, output="x")
                                                  for m in ("vanilla", "dysco", "dysco-random") for i in range(2)])
    write_store(tmp_path / "s/fp32.jsonl", fp32, [record(m, i, 1.0, store=fp32)
                                                  for m in ("vanilla", "dysco", "dysco-random") for i in range(2)])
    extra = ["--tau-stores", str(tmp_path / "none/*.jsonl")] if script == "pt_table" else []
    proc = run_script(script, "--stores", str(tmp_path / "s/*.jsonl"), *extra, "--out", str(tmp_path / "out/t"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: ") and "dtype" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_overhead_refuses_stores_of_other_settings(tmp_path):
    bf16, fp32 = settings("bfloat16"), settings("float32")
    write_store(tmp_path / "a.jsonl", bf16, [record("vanilla", 0, store=bf16)])
    write_store(tmp_path / "b.jsonl", fp32, [record("dysco", 0, store=fp32)])
    with pytest.raises(ConfigError, match="dtype"):
        measured([], [str(tmp_path / "*.jsonl")], tmp_path)


def write_xz(path: Path, store_settings, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({**HEADER, "settings": store_settings})] + [json.dumps(r) for r in records]
    path.write_bytes(lzma.compress(("\n".join(lines) + "\n").encode()))


@pytest.mark.slow
def test_budget_reports_keep_teacher_forced_apart_but_refuse_other_dtypes(tmp_path):
    tf, free = settings(teacher_forced=True), settings()
    write_xz(tmp_path / "budget/dev/m_tf.jsonl.xz", tf, [record("vanilla", 0, store=tf)])
    write_xz(tmp_path / "budget/dev/m_free.jsonl.xz", free, [record("vanilla", 0, store=free)])
    write_reports(tmp_path / "budget")  # teacher-forced and free records are read apart: no conflict
    fp32 = settings("float32")
    write_xz(tmp_path / "budget/dev/m_free32.jsonl.xz", fp32, [record("dysco", 0, store=fp32)])
    with pytest.raises(ConfigError, match="dtype"):
        write_reports(tmp_path / "budget")
    proc = run_script("budget_study", "--figures-only", "--out-dir", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith("budget_study: ") and len(proc.stderr.splitlines()) == 1
