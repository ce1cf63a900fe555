"""The selection-budget study's grid, test methods and the dev-split choice rule (no model)."""

import json

import pytest

from dysco_interp.decoding.config import DecodingConfig, preset
from dysco_interp.errors import ConfigError
from dysco_interp.studies.budget_choice import choose_config, paired_gains, ranking, shortlist
from dysco_interp.studies.budget_study import Grid, chosen_tau, dev_methods, heldout_methods, label

PAPER = {"beta": 2.0, "top_p": 0.975, "top_k": 4096, "top_k_fraction": None}


def test_the_dev_grid_holds_every_setting_once():
    methods = dev_methods(Grid(), max_new_tokens=64)
    # vanilla; K x beta at p 0.975; p x (2, 3) at K 4096 (p 0.975 already there); shares x (2, 3);
    # random heads at every K x (2, 3)
    assert len(methods) == 1 + 8 * 5 + 3 * 2 + 5 * 2 + 8 * 2
    assert len({c for c in methods.values()}) == len(methods)
    assert all(name == label(c) for name, c in methods.items())
    dysco = [c for c in methods.values() if c.method == "dysco"]
    assert {c.params.select_k for c in dysco if c.params.k_fraction is None} == {8, 16, 32, 64, 128, 256, 1024, 4096}
    assert {c.params.k_fraction for c in dysco} == {None, 0.005, 0.01, 0.02, 0.05, 0.1}
    assert all(c.max_new_tokens == 64 and c.parameter("schedule") == "reference"
               and c.parameter("template_masking") == "reference" for c in methods.values())
    assert preset("paper", max_new_tokens=64) in methods.values()


def test_the_test_methods_put_the_ablations_at_the_chosen_budget():
    chosen = {"beta": 1.5, "top_p": 0.975, "top_k": 8, "top_k_fraction": None}
    methods = heldout_methods(chosen, 120, tau=0.975)
    by_method = {c.method: c for c in methods.values() if c.method != "dysco"}
    assert by_method["uniattns"].params.tau == 0.975
    for name in ("dysco-random", "dysco-static"):
        assert (by_method[name].params.beta, by_method[name].params.select_k) == (1.5, 8)
    assert {(c.params.beta, c.params.select_k) for c in methods.values() if c.method == "dysco"} == \
        {(1.5, 8), (2.0, 4096)}
    assert "uniattns" not in {c.method for c in heldout_methods(chosen, 120).values()}


def rec(config: DecodingConfig, task: str, length: int, instance: int, value: float) -> dict:
    metric = "tf_step_accuracy" if task == "path_traversal" else "tf_logprob"
    return {"model": "m", "task": task, "length": length, "instance": str(instance), "method": label(config),
            "index": instance, "config": config.record_fields(), metric: value}


def records(gains: dict[DecodingConfig, tuple[float, float]]) -> list[dict]:
    """Two dev cells (Path Traversal 2K, MRCR 8K), two instances each; vanilla scores 0.5 / -1."""
    out = []
    vanilla = DecodingConfig(method="vanilla")
    for i in range(2):
        out += [rec(vanilla, "path_traversal", 2048, i, 0.5), rec(vanilla, "mrcr", 8192, i, -1.0)]
        for config, (pt, mrcr) in gains.items():
            out += [rec(config, "path_traversal", 2048, i, 0.5 + pt), rec(config, "mrcr", 8192, i, -1.0 + mrcr)]
    return out


def test_the_choice_is_the_lowest_mean_rank_with_ties_to_the_smaller_boost():
    base = DecodingConfig()
    small, large = base.with_params(select_k=8, beta=1.5), base.with_params(select_k=64)
    strong = base.with_params(select_k=8, beta=3.0)
    random = base.replace(method="dysco-random").with_params(select_k=8)
    # ranks: small (2, 1), large (1, 3), strong (3, 2): small 1.5, large 2, strong 2.5; random never competes
    data = records({small: (0.05, -0.01), large: (0.10, -0.20), strong: (0.0, -0.05), random: (0.5, 0.5)})
    gains = paired_gains(data, {"path_traversal": "tf_step_accuracy", "mrcr": "tf_logprob"})
    assert len(gains) == 4
    rows = ranking(data)
    assert [r["mean_rank"] for r in rows] == [1.5, 2.0, 2.5]
    assert rows[0]["config"] == {"beta": 1.5, "top_p": 0.975, "top_k": 8, "top_k_fraction": None}
    assert shortlist(data, 2)[1]["top_k"] == 64
    # equal gains everywhere: the smaller beta wins, then fewer keys
    tied = records({base.with_params(select_k=8, beta=3.0): (0.1, 0.0),
                    base.with_params(select_k=16, beta=1.5): (0.1, 0.0),
                    base.with_params(select_k=8, beta=1.5): (0.1, 0.0)})
    choice = choose_config(tied)
    assert choice["config"] == {"beta": 1.5, "top_p": 0.975, "top_k": 8, "top_k_fraction": None}
    assert choice["best_fraction"] is None and choice["best_fixed_k"]["config"] == choice["config"]


def test_a_configuration_missing_a_cell_is_no_candidate_and_no_sweep_is_an_error():
    base = DecodingConfig()
    data = records({base.with_params(select_k=8): (0.1, 0.1)})
    data += [rec(base.with_params(select_k=16), "path_traversal", 2048, i, 0.9) for i in range(2)]  # one cell only
    assert [r["config"]["top_k"] for r in ranking(data)] == [8]
    with pytest.raises(ConfigError, match="run the dev sweep first"):
        ranking(records({}))
    assert PAPER == dict(PAPER)


def test_uniattns_tau_is_chosen_on_the_papers_grid_only(tmp_path):
    """An older, harsher sweep in the same store is never chosen, even where it scores best."""
    assert chosen_tau(tmp_path, "m") is None
    path = tmp_path / "mrcr" / "m_2k_tau.jsonl"
    path.parent.mkdir()
    scores = {0.7: 0.9, 0.975: 0.5, 0.95: 0.6, 0.9: 0.4, 0.85: 0.3}
    path.write_text("".join(
        json.dumps({"model": "m", "task": "mrcr", "length": 2048, "index": i, "id": f"mrcr-{i}", "score": score,
                    "method": f"uniattns tau={tau:g}", "config": {"method": "uniattns", "tau": tau}}) + "\n"
        for tau, score in scores.items() for i in range(3)))
    assert chosen_tau(tmp_path, "m") == 0.95
