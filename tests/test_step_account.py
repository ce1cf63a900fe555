"""The step account: the gate's dev rule, fix and break rates by signal, the picks, and one whole
run of its parts and report on a tiny model."""

import json

import pytest

from dysco_interp.analysis.step_signals import SIGNALS, Signal, classified, cluster_ratio, rates_by_bin
from dysco_interp.errors import ConfigError
from dysco_interp.studies.gate_choice import GRID, choose_gate, gate_scores, simulated


def step(k, vanilla, dysco, mass, rank=1, **more):
    return {"step": k, "correct": {"vanilla": vanilla, "dysco": dysco}, "selected_mass": mass, "qr_rank": rank,
            "qr_mass": 0.1, "logprob": {"vanilla": -1.0, "dysco": -0.5}, "margin": {"vanilla": 1.0, "dysco": 1.0},
            "picks": {}, "pick_ranks": {}, **more}


def record(instance, steps, length=2048, model="m"):
    return {"model": model, "length": length, "instance": instance, "n_hops": len(steps), "steps": steps}


def test_the_gate_takes_dysco_where_the_mass_reaches_the_threshold_and_vanilla_elsewhere():
    s = step(0, vanilla=True, dysco=False, mass=0.3)
    assert simulated(s, 0.0) is False and simulated(s, 0.3) is False and simulated(s, 0.35) is True


def test_the_chosen_threshold_keeps_the_fixes_where_the_relevance_is_concentrated_and_drops_the_breaks():
    # DySCO fixes steps where its selection holds much relevance and breaks those where it holds little
    records = [record(f"i{i}", [step(0, False, True, 0.6), step(1, True, False, 0.1), step(2, True, True, 0.05)])
               for i in range(4)]
    choice = choose_gate(records + [record("other", [step(0, True, False, 0.9)], model="n")], "m")
    assert choice["min_mass"] == 0.15 and choice["helps_on_dev"]  # the smallest grid threshold above 0.1
    assert choice["dev_instances"] == 4 and choice["scores"]["0"] == pytest.approx(2 / 3)
    assert choice["scores"]["0.15"] == pytest.approx(1.0)


def test_no_gate_beats_plain_dysco_when_breaks_and_fixes_have_the_same_mass_and_ties_go_to_zero():
    records = [record("a", [step(0, False, True, 0.5), step(1, True, False, 0.5)])]
    choice = choose_gate(records, "m")
    assert choice["min_mass"] == 0.0 and not choice["helps_on_dev"]
    assert set(gate_scores(records)) == set(GRID)
    with pytest.raises(ConfigError, match="dev"):
        choose_gate([], "m")


def test_fix_and_break_rates_count_steps_within_each_bin_and_resample_instances():
    records = [record("a", [step(0, False, True, 0.05), step(1, True, False, 0.5), step(2, True, True, 0.5)]),
               record("b", [step(0, False, False, 0.05), step(1, True, True, 0.5)])]
    rows = classified(records)
    assert [r["class"] for r in rows] == ["fixed", "broken", "both right", "both wrong", "both right"]
    mass = Signal("selected_mass", "mass", (0.1,), lambda s: s["selected_mass"])
    low, high = rates_by_bin(rows, mass, n_boot=200)
    assert low["bin"] == "< 0.1" and low["fix"]["events"] == 1 and low["fix"]["eligible"] == 2
    assert low["break"] is None  # no step vanilla got right has so little mass
    assert high["break"]["mean"] == pytest.approx(1 / 3, abs=1e-5) and high["fix"] is None
    assert {s.key for s in SIGNALS} >= {"qr_rank", "selected_mass", "gold_selected_share", "base_margin"}


def test_a_cluster_ratio_pools_events_and_its_interval_holds_the_estimate():
    est = cluster_ratio([(1, 4), (0, 4), (3, 4)], n_boot=500)
    assert est["mean"] == pytest.approx(4 / 12, abs=1e-5) and est["lo"] <= est["mean"] <= est["hi"]
    assert est["clusters"] == 3 and cluster_ratio([(0, 0)]) is None


def test_a_pick_names_the_edge_into_the_one_city_its_first_token_starts(tiny_llama):
    import torch

    from dysco_interp.analysis.step_mechanism import destination_tokens, picked_edge
    from dysco_interp.tasks.path_traversal import generate_instance

    inst = generate_instance(tiny_llama.tokenizer, 2500, seed=3)
    by_token = destination_tokens(inst, tiny_llama.tokenizer)
    ranks = torch.arange(1, inst.n_edges + 1)
    for edge in inst.edges:
        first = tiny_llama.tokenizer.encode(" " + edge.dst, add_special_tokens=False)[0]
        cities = {inst.edges[j].dst for j in by_token[first]}
        expected = min(j for j in by_token[first]) if len(cities) == 1 else None
        assert picked_edge(first, by_token, inst, ranks) == expected
    assert picked_edge(-1, by_token, inst, ranks) is None


@pytest.mark.real_model
def test_the_parts_and_the_report_run_end_to_end_on_a_tiny_model(tmp_path):
    from pathlib import Path

    from dysco_interp.heads import HeadSet
    from dysco_interp.models.tiny import tiny_model
    from dysco_interp.studies import step_account
    from dysco_interp.studies.step_account_report import write_reports
    from dysco_interp.tasks import make_dataset, save_dataset

    model = tiny_model("llama", max_position_embeddings=4096)
    data = tmp_path / "data"
    for split, seed in (("dev", 1), ("test", 0)):
        save_dataset(data / split / "path_traversal_1950.jsonl",
                     make_dataset("path_traversal", model.tokenizer, 1950, n=2, seed=seed, progress=False))
    heads = HeadSet([(1, 0), (2, 1)])
    lines: list[str] = []

    def settings(split):
        return step_account.AccountSettings("tiny-llama", data, tmp_path / "out", split, ("1950",), backend="sdpa")

    with pytest.raises(ConfigError, match="dev split first"):
        step_account.run_account(model, heads, settings("test"), ["steps"])
    step_account.run_account(model, heads, settings("dev"), ["steps", "gate"], log=lines.append)
    gate = json.loads(settings("dev").gate_path.read_text())
    assert gate["min_mass"] in GRID and "2 new records" in lines[0] and "gate for tiny-llama" in lines[1]
    step_account.run_account(model, heads, settings("test"), ["steps", "free"], log=lines.append)
    records = step_account.step_records(settings("test").store("1950", "steps"))
    assert len(records) == 2 and all(set(s["correct"]) == {"vanilla", "dysco", "gated"}
                                     for r in records for s in r["steps"])
    first = records[0]["steps"][0]
    assert first["n_selected"] is not None and 0 <= first["selected_mass"] <= 1
    assert first["gold_selected_share"] is None or 0 <= first["gold_selected_share"] <= 1
    # resumed: nothing decoded twice
    again: list[str] = []
    step_account.run_account(model, heads, settings("test"), ["steps"], log=again.append)
    assert " 0 new records" in again[0]
    written = write_reports(tmp_path / "out" / "step_account")
    assert {Path(p).name for p in written} == {"step_account.json", "step_account.md", "examples.md", "signals.png",
                                         "signals.html"}
    result = json.loads((tmp_path / "out" / "step_account" / "step_account.json").read_text())
    assert result["classes"][0]["steps"] == sum(len(r["steps"]) for r in records)
    assert result["gate"][0]["min_mass"] == gate["min_mass"]
    with pytest.raises(ConfigError, match="dev split only"):
        step_account.run_account(model, heads, settings("test"), ["gate"])


FIGURES = __import__("pathlib").Path(__file__).resolve().parents[1] / "figures" / "step_account"


@pytest.mark.parametrize("model", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_the_committed_gates_follow_from_the_committed_dev_stores(model):
    from pathlib import Path

    from dysco_interp.studies.step_account import AccountSettings, dev_records

    settings = AccountSettings(model, Path("."), FIGURES.parent, "dev", ())
    assert choose_gate(dev_records(settings), model) == json.loads((FIGURES / f"gate_{model}.json").read_text())


def test_the_report_redraws_the_committed_tables_from_the_stores(tmp_path):
    import shutil

    from dysco_interp.studies.step_account_report import write_reports

    folder = tmp_path / "step_account"
    shutil.copytree(FIGURES, folder, ignore=shutil.ignore_patterns("*.md", "step_account.json", "*.png", "*.html"))
    write_reports(folder)
    for name in ("step_account.json", "step_account.md", "examples.md"):
        assert (folder / name).read_text() == (FIGURES / name).read_text(), name
