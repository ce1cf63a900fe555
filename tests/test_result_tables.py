"""Tables of evaluation records: method identity from the config, tau choice, grouping,
paired deltas, bootstrap intervals, the store reader and the benchmark reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dysco_interp.analysis import result_tables as T
from dysco_interp.analysis.bench_results import decode_rows, record_speed_rows
from dysco_interp.analysis.bootstrap import bootstrap_ci
from dysco_interp.analysis.method_key import MethodKey, method_key
from dysco_interp.analysis.records import Sourced, check_comparable, display_path, load_records, read_records
from dysco_interp.errors import ConfigError
from dysco_interp.stores.archives import expand

CI = T.CIOptions(n_boot=500, seed=0)


def rec(method="vanilla", label=None, *, task="path_traversal", model="m", length=1024, index=0, seed=0,
        new_tokens=120, timings=None, **fields):
    """A stored record; `fields` holds config overrides (tau, top_p, ...) and metric values."""
    metric_names = {"accuracy", "step_accuracy", "partial_accuracy", "score"}
    config = {"method": method, "beta": 2.0, "top_p": 0.975, "top_k": 4096, "decay": 0.75, "warmup": 8,
              "top_k_fraction": None, "schedule": "reference", "template_masking": "reference", "tau": 1.0,
              "head_seed": 0, "max_new_tokens": new_tokens, "enable_thinking": None}
    config.update({k: v for k, v in fields.items() if k not in metric_names})
    out = {"model": model, "task": task, "length": length, "method": label or method, "seed": seed,
           "index": index, "id": f"{task}-{index}", "config": config,
           "timings": timings or {"decode_tok_per_s": 10.0}}
    out.update({k: v for k, v in fields.items() if k in metric_names})
    return out


def pt(method, accs, label=None, **cfg):
    return [rec(method, label, index=i, accuracy=a, step_accuracy=a / 2, partial_accuracy=a, **cfg)
            for i, a in enumerate(accs)]


# ---------------------------------------------------------------------------- method identity


def test_method_key_reads_the_config_not_the_label():
    a = method_key(rec("dysco", "my grid point", top_p=0.9))
    b = method_key(rec("dysco", "dysco p=0.9", top_p=0.9))
    assert a == b and a.label == "DySCO (p=0.9)" and a.deviations() == {"top_p": 0.9}
    assert method_key(rec("dysco", "dysco")).label == "DySCO" and method_key(rec("dysco")).is_default
    assert method_key(rec("uniattns", "uniattns-tau0.85", tau=0.85)).label == "UniAttnS (tau=0.85)"
    assert method_key(rec("dysco-random", head_seed=3)).label == "DySCO random heads (seed 3)"
    # integer and float spellings of one value are one method
    assert method_key(rec("dysco", beta=2)) == method_key(rec("dysco", beta=2.0))
    # vanilla ignores DySCO fields it does not use
    assert method_key(rec("vanilla", top_p=0.5)) == MethodKey("vanilla")


def test_records_from_before_a_field_existed_read_as_what_ran_then():
    legacy = rec("dysco", template_masking=True)
    for field in ("schedule", "top_k_fraction"):
        del legacy["config"][field]
    key = method_key(legacy)
    assert key.value("schedule") == "paper" and key.value("template_masking") == "skeleton"
    assert key.value("top_k_fraction") == 0.0  # no cap by share
    assert key != method_key(rec("dysco")) and key.is_default  # the protocol differs, the parameters do not
    assert key.label == "DySCO (schedule=paper, template masking=skeleton)"
    off = rec("dysco", template_masking=False)
    assert method_key(off).value("template_masking") == "off"
    assert method_key(rec("dysco", top_k_fraction=0.05)).label == "DySCO (K/n=0.05)"


def test_method_key_errors_are_clear():
    bad = rec("dysco")
    del bad["config"]
    with pytest.raises(ConfigError, match="no config"):
        method_key(bad)
    with pytest.raises(ConfigError, match="unknown config method"):
        method_key(rec("greedy-ish"))
    with pytest.raises(ConfigError, match="top_k"):
        method_key(rec("dysco", top_k="many"))


# ---------------------------------------------------------------------------- tau choice


def test_choose_tau_best_mean_then_closest_to_one():
    assert T.choose_tau({0.7: 0.2, 0.85: 0.3, 1.0: 0.25}) == 0.85
    assert T.choose_tau({0.7: 0.3, 0.85: 0.3, 1.0: 0.1}) == 0.85  # tie -> closest to 1
    assert T.choose_tau({0.7: 0.0, 0.85: 0.0, 1.0: 0.0}) == 1.0
    assert T.choose_tau({0.85: 0.3, 1.15: 0.3}) == 0.85  # equally close -> the smaller
    assert T.choose_tau({0.7: 0.1 + 0.2, 0.9: 0.3}) == 0.9  # float noise is a tie
    assert T.choose_tau({0.5: 0.31, 0.9: 0.3}) == 0.5  # a real difference wins over closeness
    with pytest.raises(ConfigError):
        T.choose_tau({})


def test_tau_sweep_groups_by_config_tau_per_model():
    records = (
        [rec("uniattns", "uniattns-tau0.7", task="mrcr", tau=0.7, index=i, score=s) for i, s in enumerate([0.5, 0.7])]
        + [rec("uniattns", "t=0.85", task="mrcr", tau=0.85, index=i, score=s) for i, s in enumerate([0.6, 0.6])]
        + [rec("uniattns", task="mrcr", tau=0.7, index=0, score=0.0, model="other")]
        + [rec("vanilla", task="mrcr", index=0, score=1.0)]  # not part of the sweep
        + [rec("uniattns", tau=0.5, index=0, accuracy=1.0)]  # Path Traversal: not part of it either
    )
    sweep = T.tau_sweep(records, ci=CI)
    assert set(sweep) == {"m", "other"}
    assert [r["tau"] for r in sweep["m"]["rows"]] == [0.7, 0.85]
    assert sweep["m"]["rows"][0]["score"]["mean"] == pytest.approx(0.6) and sweep["m"]["rows"][0]["n"] == 2
    assert sweep["m"]["chosen_tau"] == 0.85 and sweep["m"]["tied"]  # 0.6 vs 0.6: tie -> closer to 1
    assert sweep["other"]["chosen_tau"] == 0.7 and not sweep["other"]["all_tied"]


# ---------------------------------------------------------------------------- bootstrap


def test_bootstrap_interval_of_two_values_and_degenerate_cases():
    # resampled means of [0, 1] are 0, 0.5, 1 with probability 1/4, 1/2, 1/4
    ci = bootstrap_ci([0.0, 1.0], n_boot=4000, seed=1)
    assert (ci.mean, ci.lo, ci.hi, ci.n) == (0.5, 0.0, 1.0, 2)
    narrow = bootstrap_ci([0.0, 1.0], level=0.4, n_boot=4000, seed=1)
    assert (narrow.lo, narrow.hi) == (0.5, 0.5)
    assert bootstrap_ci([0.25] * 7).as_dict() == {"mean": 0.25, "lo": 0.25, "hi": 0.25, "n": 7}
    values = [0, 1, 1, 0, 1, 0, 0, 1, 1, 1]
    a, b = bootstrap_ci(values, seed=3), bootstrap_ci(values, seed=3)
    assert a == b and a.lo < a.mean == 0.6 < a.hi
    wide = bootstrap_ci(values[:4], seed=3)
    assert wide.hi - wide.lo > a.hi - a.lo
    with pytest.raises(ConfigError):
        bootstrap_ci([])
    with pytest.raises(ConfigError):
        bootstrap_ci([1.0, float("nan")])


# ---------------------------------------------------------------------------- grouping


def test_a_run_stored_twice_counts_once():
    def pooled(records):
        return check_comparable(Sourced(r, Path("s.jsonl"), {}) for r in records)

    records = pt("vanilla", [1, 0]) + pt("vanilla", [1, 0], label="copy") + pt("dysco", [1, 1])
    once = pooled(records)
    assert once.dropped == 2 and once.differing == 0 and len(once.records) == 4
    # same index, other data (the id names the data seed): two instances, not a repeat
    other_data = [dict(r, id="path_traversal-s1-0") for r in pt("vanilla", [0])]
    assert pooled(pt("vanilla", [1]) + other_data).dropped == 0
    cells = T.group(once.records)
    (cell,) = cells
    assert cell.length == 1024 and dict(cell.setting)["max_new_tokens"] == 120
    assert {k.method: len(v) for k, v in cells[cell].items()} == {"vanilla": 2, "dysco": 2}


def test_free_and_format_forced_records_are_never_pooled():
    free = pt("dysco", [1, 0])
    forced = [dict(r, decoding="format-forced") for r in pt("dysco", [0, 0])]
    for tabulate in (T.group, T.by_cell):
        with pytest.raises(ConfigError, match="has free and format-forced records: table the two modes"):
            tabulate(free + forced)
    assert T.decoding_mode(forced[0]) == "format-forced" and T.decoding_mode(free[0]) == "free"
    assert T.decoding_mode(dict(free[0], settings={"teacher_forced": True})) == "teacher-forced"
    # on other instances too: a method's mean over both modes would mean nothing
    with pytest.raises(ConfigError, match="has format-forced and free records: table the two modes"):
        T.by_cell(forced + [dict(r, index=r["index"] + 5, id=f"x-{r['index']}") for r in free])
    assert len(T.by_cell(forced + pt("vanilla", [1, 1]))[0]) == 1  # vanilla decoded freely beside them is fine


def test_pt_table_uses_the_chosen_tau_and_pairs_deltas_by_instance():
    records = (pt("vanilla", [1, 0, 0, 1]) + pt("dysco", [1, 1, 0, 1], label="dysco (fast backend)")
               + pt("uniattns", [0, 0, 0, 1], tau=0.85) + pt("uniattns", [1, 1, 1, 1], tau=0.7)
               + pt("dysco-static", [0, 0, 0, 0]))
    rows, notes = T.pt_table(records, {"m": 0.85}, CI)
    assert [r["method"] for r in rows] == ["vanilla", "UniAttnS (tau=0.85)", "DySCO"]
    vanilla, uni, dysco = rows
    assert vanilla["n"] == 4 and vanilla["metrics"]["accuracy"]["mean"] == 0.5 and "delta" not in vanilla
    assert uni["metrics"]["accuracy"]["mean"] == 0.25 and uni["delta"]["accuracy"]["mean"] == -0.25
    assert dysco["delta"]["accuracy"]["mean"] == 0.25  # paired: [0, 1, 0, 0]
    assert dysco["metrics"]["step_accuracy"]["mean"] == pytest.approx(0.375)
    for r in rows:
        for est in r["metrics"].values():
            assert est["lo"] <= est["mean"] <= est["hi"]
    assert any("0.7" in n and "not the MRCR choice" in n for n in notes)
    assert any("DySCO static" in n for n in notes)


def test_pt_table_tau_one_is_vanilla_and_a_missing_tau_is_reported():
    records = pt("vanilla", [1, 0]) + pt("dysco", [1, 1])
    rows, _ = T.pt_table(records, {"m": 1.0}, CI)
    uni = rows[1]
    assert uni["method"] == "UniAttnS (tau=1 = vanilla)" and uni["metrics"]["accuracy"]["mean"] == 0.5
    rows, notes = T.pt_table(records, {"m": 0.5}, CI)
    assert rows[1]["n"] == 0 and rows[1]["metrics"]["accuracy"] is None
    assert any("tau=0.5 was not evaluated" in n for n in notes)
    rows, notes = T.pt_table(records, {}, CI)
    assert [r["method"] for r in rows] == ["vanilla", "DySCO"] and any("no MRCR tau sweep" in n for n in notes)


def test_pt_table_splits_lengths_and_token_budgets():
    records = (pt("vanilla", [1]) + [dict(r, length=2048) for r in pt("vanilla", [0])]
               + pt("vanilla", [0], new_tokens=64))
    rows, _ = T.pt_table(records, {}, CI)
    assert [(r["length"], r["setting"]["max_new_tokens"], r["metrics"]["accuracy"]["mean"]) for r in rows] == [
        (1024, 64, 0.0), (1024, 120, 1.0), (2048, 120, 0.0)]


def test_ablation_rows_compare_variants_at_equal_parameters():
    records = []
    for task, metric in (("path_traversal", "accuracy"), ("mrcr", "score")):
        for method, vals in (("dysco", [1, 1, 0]), ("dysco-random", [0, 1, 0]), ("dysco-static", [1, 0, 0])):
            records += [rec(method, task=task, index=i, **{metric: v}) for i, v in enumerate(vals)]
    # a random-head run at other parameters has no DySCO partner
    records += [rec("dysco-random", top_p=0.9, index=0, accuracy=1)]
    rows, notes = T.ablation_table(records, CI)
    pt_rows = [r for r in rows if r["task"] == "path_traversal"]
    assert [r["variant"] for r in pt_rows] == ["dysco", "dysco-random", "dysco-static", "dysco-random"]
    assert pt_rows[1]["delta"]["accuracy"]["mean"] == pytest.approx(-1 / 3, abs=1e-4)
    assert pt_rows[2]["delta"]["accuracy"]["mean"] == pytest.approx(-1 / 3, abs=1e-4)
    # a variant with no DySCO partner keeps a delta per metric, each None (no pair to difference)
    assert pt_rows[3]["delta"] == dict.fromkeys(pt_rows[1]["delta"]) and "accuracy" in pt_rows[3]["delta"]
    assert [r["variant"] for r in rows if r["task"] == "mrcr"] == ["dysco", "dysco-random", "dysco-static"]
    assert any("no DySCO run with the variants' parameters (top_p=0.9)" in n for n in notes)


def test_robustness_points_move_one_parameter_at_a_time():
    records = (pt("dysco", [1, 0]) + pt("dysco", [0, 0], top_p=0.9) + pt("dysco", [1, 1], top_k=64)
               + pt("dysco", [1, 0], beta=1.5) + pt("dysco", [1, 1], top_p=0.9, top_k=64)
               + pt("dysco", [1, 1], decay=0.5) + pt("vanilla", [0, 0]))
    points, notes = T.robustness_points(records, CI)
    by = {(p["param"], p["value"]): p for p in points}
    assert set(by) == {("top_p", 0.9), ("top_p", 0.975), ("top_k", 64), ("top_k", 4096), ("beta", 1.5),
                       ("beta", 2.0)}
    assert by[("top_k", 4096)]["is_default"] and not by[("top_k", 64)]["is_default"]
    assert by[("top_k", 64)]["metrics"]["accuracy"]["mean"] == 1.0
    assert by[("top_p", 0.975)]["metrics"] == by[("beta", 2.0)]["metrics"]  # the shared default run
    assert sum("at once; left out" in n for n in notes) == 2


# ---------------------------------------------------------------------------- reading stores


def test_read_records_is_read_only_and_tolerant(tmp_path):
    path = tmp_path / "s.jsonl"
    lines = [json.dumps({"kind": "header", "x": 1}), json.dumps(rec("vanilla")), json.dumps(rec("dysco"))]
    text = "\n".join(lines) + "\n" + '{"model": "m", "task'  # a write cut short
    path.write_text(text)
    records = read_records(path)
    assert [r["method"] for r in records] == ["vanilla", "dysco"]
    assert path.read_text() == text  # never rewritten
    path.write_text(lines[1] + "\nnot json\n" + lines[2] + "\n")
    with pytest.raises(ConfigError, match="line 2"):
        read_records(path)
    path.write_text(lines[0] + "\n" + json.dumps({"model": "m"}) + "\n")
    with pytest.raises(ConfigError, match="lacks"):
        read_records(path)
    path.write_text(json.dumps({"model": "m"}) + "\n")
    with pytest.raises(ConfigError, match="not a dysco-interp result store"):
        read_records(path)


def test_expand_and_load_report_unmatched_patterns(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps(rec()) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps(rec(index=1)) + "\n")
    files, unmatched = expand([str(tmp_path / "*.jsonl"), str(tmp_path / "a.jsonl"), str(tmp_path / "none/*.jsonl")])
    assert [f.name for f in files] == ["a.jsonl", "b.jsonl"] and unmatched == [str(tmp_path / "none/*.jsonl")]
    records, _, _ = load_records([str(tmp_path / "*.jsonl")])
    assert len(records) == 2
    assert display_path(tmp_path / "a.jsonl", tmp_path) == "a.jsonl"


def test_a_store_name_or_pattern_finds_its_compressed_archive(tmp_path):
    import lzma

    from dysco_interp.stores.archives import stored, stores_in

    (tmp_path / "a.jsonl").write_text(json.dumps(rec()) + "\n")
    for name, index in (("a.jsonl.xz", 0), ("b.jsonl.xz", 1)):
        (tmp_path / name).write_bytes(lzma.compress((json.dumps(rec(index=index)) + "\n").encode()))
    (tmp_path / "a.jsonl.lock").write_text("")
    # a store and its archive are one store: the uncompressed one is read where both are there
    files, unmatched = expand([str(tmp_path / "*.jsonl"), str(tmp_path / "b.jsonl")])
    assert [f.name for f in files] == ["a.jsonl", "b.jsonl.xz"] and unmatched == []
    assert [r["index"] for r in load_records([str(tmp_path / "*.jsonl")])[0]] == [0, 1]
    assert [p.name for p in stores_in(tmp_path)] == ["a.jsonl", "b.jsonl.xz"]
    assert stored(tmp_path / "b.jsonl").name == "b.jsonl.xz" and stored(tmp_path / "c.jsonl").name == "c.jsonl"


# ---------------------------------------------------------------------------- benchmark reader


def test_decode_rows_reads_flat_nested_and_per_method_layouts():
    flat = {"model": "q", "rows": [{"context": 2048, "vanilla_tok_per_s": 2.0, "dysco_tok_per_s": 1.0}]}
    rows, notes = decode_rows(flat, "flat.json")
    assert rows[0]["slowdown"] == 2.0 and rows[0]["context"] == 2048 and rows[0]["vanilla_peak_gib"] is None
    assert any("no peak memory for vanilla" in n for n in notes)
    nested = {"device": "H100", "rows": [{"n_context": 100000, "batch_size": 4,
                                          "vanilla": {"decode_tok_per_s": 30, "peak_memory_mib": 2048},
                                          "dysco": {"step_ms": 50, "peak_mem_bytes": 3 * 2**30}}]}
    (row,), notes = decode_rows(nested, "gpu.json")
    assert row["dysco_tok_per_s"] == 20.0 and row["vanilla_peak_gib"] == 2.0 and row["dysco_peak_gib"] == 3.0
    assert row["memory_ratio"] == 1.5 and row["label"] == "H100, ctx 100000, batch 4" and notes == []
    per_method = [{"method": "vanilla", "context": 1024, "tok_per_s": 8, "peak_mem_gb": 1},
                  {"method": "dysco", "context": 1024, "tok_per_s": 4, "peak_mem_gb": 1.5},
                  {"method": "dysco", "context": 4096, "tok_per_s": 2}]
    rows, notes = decode_rows(per_method, "pm.json")
    assert [(r["context"], r["slowdown"]) for r in rows] == [(1024, 2.0), (4096, None)]
    rows, notes = decode_rows({"rows": [{"tokens": 5}]}, "prefill.json")
    assert rows == [] and "skipped" in notes[0]
    static = {"backend": "static", "yarn_factor": 4.0, "rows": [{"context": 131072, "vanilla_tok_per_s": 2.0,
                                                                   "dysco_tok_per_s": 1.0}]}
    (row,), _ = decode_rows(static, "yarn.json")  # a static file that names no attention timed the float32 one
    assert row["attention"] == "float32" and row["yarn"] == 4.0
    assert row["label"] == "static, ctx 128K, float32 attention, YaRN 4"


def test_record_speed_rows_take_medians_of_default_runs():
    def t(n_new, decode_s, batch=1):
        return {"n_new": n_new, "decode_s": decode_s, "batch_size": batch}

    records = ([rec("vanilla", index=i, timings=t(11, 10 / v)) for i, v in enumerate([10, 30, 20])]
               + [rec("dysco", index=i, timings=t(11, 10 / v)) for i, v in enumerate([5, 10, 15])]
               + [rec("dysco", top_p=0.5, timings=t(11, 0.1))])
    (row,) = record_speed_rows(records, "store")
    assert (row["vanilla_tok_per_s"], row["dysco_tok_per_s"]) == pytest.approx((20, 10))
    assert row["n_runs"] == {"vanilla": 3, "dysco": 3} and row["batch"] == 1


def test_record_speed_rows_count_a_batch_as_one_run_with_all_its_tokens():
    records = ([rec("vanilla", index=i, timings={"n_new": n, "decode_s": 2.0, "batch_size": 2})
                for i, n in enumerate([11, 21])]
               + [rec("dysco", index=i, timings={"n_new": n, "decode_s": 5.0, "batch_size": 2})
                  for i, n in enumerate([11, 21])])
    (row,) = record_speed_rows(records, "store")
    assert (row["vanilla_tok_per_s"], row["dysco_tok_per_s"]) == pytest.approx((15.0, 6.0))
    assert row["batch"] == 2 and row["n_runs"] == {"vanilla": 1, "dysco": 1} and "batch of 2" in row["label"]


def test_headerless_records_pool_with_recorded_ones_on_their_backend_and_are_counted():
    old = [rec("vanilla", index=i, accuracy=0.0, backend="sdpa") for i in range(3)]
    new = [{**rec("uniattns", index=i, tau=0.9, accuracy=1.0), "instance": f"h{i}", "seed": None}
           for i in range(3)]
    settings = {"backend": "sdpa", "device": "cuda", "dtype": "bfloat16"}
    pooled = check_comparable([Sourced(r, Path("old.jsonl"), {"backend": "sdpa"}, recorded=False) for r in old]
                              + [Sourced(r, Path("new.jsonl"), settings) for r in new])
    assert len(pooled.records) == 6 and pooled.unrecorded == 3
    assert any("3 records come from headerless stores" in n for n in pooled.notes())
    other = {**settings, "backend": "static"}
    with pytest.raises(ConfigError, match="do not pool"):
        check_comparable([Sourced(r, Path("old.jsonl"), {"backend": "sdpa"}, recorded=False) for r in old]
                         + [Sourced(r, Path("new.jsonl"), other) for r in new])
    # two recorded stores still refuse what they record differently
    with pytest.raises(ConfigError, match="do not pool"):
        check_comparable([Sourced(new[0], Path("a.jsonl"), settings), Sourced(new[1], Path("b.jsonl"), other)])


def test_deltas_pair_a_current_record_with_a_format_1_one_by_the_instance_id():
    vanilla = [rec("vanilla", index=i, accuracy=a) for i, a in enumerate([0.0, 1.0, 0.0])]
    current = [{**rec("uniattns", index=i, tau=0.9, accuracy=a), "instance": f"h{i}", "seed": None}
               for i, a in enumerate([1.0, 1.0, 0.0])]
    delta = T.paired_deltas(current, vanilla, ["accuracy"], CI)["accuracy"]
    assert (delta["n"], delta["better"], delta["worse"]) == (3, 1, 0)
    # where both sides name the content, the content decides: another instance's hash never pairs
    renamed = [{**r, "instance": f"x{i}"} for i, r in enumerate(vanilla)]
    assert T.paired_deltas(current, renamed, ["accuracy"], CI)["accuracy"] is None
