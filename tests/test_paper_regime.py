"""The paper-regime study: its dev slice of the budget grid, the one-rule choice over every dev cell,
the test methods, and one whole run of its parts on a tiny model."""

import json

import pytest

from dysco_interp.decoding.config import DecodingConfig, preset
from dysco_interp.decoding.format_forced import FORMAT_FORCED
from dysco_interp.errors import ConfigError
from dysco_interp.stores.format import read_header
from dysco_interp.studies import budget_study, paper_regime
from dysco_interp.studies.budget_study import Grid, label
from dysco_interp.studies.length_rule import best_tau, choose_rule, winners_by_length


def test_the_dev_slice_lies_on_the_budget_grid_so_short_and_long_cells_rank_the_same_candidates():
    slice_ = paper_regime.dev_methods(64)
    grid = budget_study.dev_methods(Grid(), 64)
    outside = {name for name, c in slice_.items() if c not in grid.values()}
    assert {slice_[name] for name in outside} == {preset("paper-long", max_new_tokens=64),
                                                 preset("quick-check", max_new_tokens=64)}
    assert "vanilla" in slice_ and all(c.method in ("vanilla", "dysco") for c in slice_.values())


def rec(config: DecodingConfig, task: str, length: int, instance: int, value: float) -> dict:
    metric = "tf_step_accuracy" if task == "path_traversal" else "tf_logprob"
    return {"model": "m", "task": task, "length": length, "instance": str(instance), "method": label(config),
            "index": instance, "config": config.record_fields(), metric: value}


def cells(gains: dict[DecodingConfig, dict[int, float]], lengths=(2048, 131072)) -> list[dict]:
    """Path Traversal and MRCR at each length, two instances; a config's gain may differ by length
    (missing length: not run there)."""
    out = []
    vanilla = DecodingConfig(method="vanilla")
    for length in lengths:
        for task in ("path_traversal", "mrcr"):
            for i in range(2):
                out.append(rec(vanilla, task, length, i, 0.0))
                out += [rec(c, task, length, i, g[length]) for c, g in gains.items() if length in g]
    return out


def test_one_rule_wins_overall_while_each_length_names_its_own_winner():
    base = DecodingConfig()
    small, share = base.with_params(select_k=8, beta=1.5), base.with_params(select_k=4096, k_fraction=0.02, beta=2.0)
    paper_long = preset("paper-long")  # only run at the long cells
    choice = choose_rule(cells({small: {2048: 0.2, 131072: 0.01}, share: {2048: 0.1, 131072: 0.05},
                                paper_long: {131072: 0.3}}))
    # small ranks (1, 2), share (2, 1): a tie at 1.5 goes to the smaller boost
    assert choice["config"] == {"beta": 1.5, "top_p": 0.975, "top_k": 8, "top_k_fraction": None}
    assert choice["other_kind"]["top_k_fraction"] == 0.02
    assert choice["n_candidates"] == 2  # paper-long missed the short cells
    by_length = choice["by_length"]
    assert by_length["2048"]["config"]["top_k"] == 8
    assert by_length["131072"]["config"] == {"beta": 2.5, "top_p": 0.975, "top_k": 8192, "top_k_fraction": None}
    assert by_length["131072"]["n_candidates"] == 3
    assert winners_by_length([]) == {}
    with pytest.raises(ConfigError, match="dev sweep"):
        choose_rule(cells({}))  # vanilla alone


def test_the_tau_is_the_best_mean_mrcr_gain_and_needs_a_sweep():
    vanilla = DecodingConfig(method="vanilla")
    records = []
    for i in range(2):
        records.append(rec(vanilla, "mrcr", 4096, i, -1.0))
        for tau, value in ((0.7, -0.9), (0.8, -0.8), (0.9, -0.8)):
            records.append(rec(vanilla.replace(method="uniattns").with_params(tau=tau), "mrcr", 4096, i, value))
    assert best_tau(records) == 0.9  # a tie goes to the gentler change
    with pytest.raises(ConfigError, match="tau part"):
        best_tau([r for r in records if r["method"] == "vanilla"])
    # the choice reads only the current grid: 0.7 and 0.8 are off it, whatever they scored
    kept = {(r["config"]["method"], r["config"]["tau"]) for r in records if paper_regime.on_grid(r)}
    assert kept == {("vanilla", 1.0), ("uniattns", 0.9)} and records[1]["method"] == "uniattns tau=0.7"


def test_the_test_methods_hold_every_preset_the_choice_and_its_ablations():
    choice = {"config": {"beta": 1.5, "top_p": 0.975, "top_k": 8, "top_k_fraction": None}, "tau": 0.95,
              "tau_grid": list(paper_regime.TAUS),
              "other_kind": {"beta": 2.0, "top_p": 0.975, "top_k": 4096, "top_k_fraction": 0.02}}
    methods = paper_regime.test_methods(choice, 400)
    configs = list(methods.values())
    for name in paper_regime.TEST_PRESETS:
        assert preset(name, max_new_tokens=400) in configs
    assert preset("paper", method="uniattns", params={"tau": 0.95}, max_new_tokens=400) in configs  # on the paper's
    # a tau chosen on another grid (the first run's 0.6-0.9) is not run again
    older = {k: v for k, v in choice.items() if k != "tau_grid"}
    assert "uniattns" not in {c.method for c in paper_regime.test_methods(older, 400).values()}
    assert {(c.method, c.params.select_k, c.params.beta) for c in configs
            if c.method in ("dysco-random", "dysco-static")} == \
        {("dysco-random", 8, 1.5), ("dysco-static", 8, 1.5)}
    assert any(c.parameter("k_fraction") == 0.02 for c in configs)
    assert len(configs) == 9  # the choice is small-budget: one entry, not two
    short = paper_regime.test_methods(choice, 32, with_ablations=False)
    assert not {"dysco-random", "dysco-static"} & {c.method for c in short.values()}


def test_the_parts_run_end_to_end_on_a_tiny_model(tmp_path, monkeypatch):
    from dysco_interp.heads import HeadSet
    from dysco_interp.models.tiny import tiny_model
    from dysco_interp.tasks import make_dataset, save_dataset

    tiny_llama = tiny_model("llama", max_position_embeddings=4096)  # room for the 400 forced tokens
    data = tmp_path / "data"
    for split, seed in (("dev", 1), ("test", 0)):
        for task in ("path_traversal", "mrcr"):
            save_dataset(data / split / f"{task}_1950.jsonl",
                         make_dataset(task, tiny_llama.tokenizer, 1950, n=1, seed=seed, progress=False))
    # a narrower sweep keeps the CPU run short; the parts, stores and choice are what is checked
    monkeypatch.setattr(paper_regime, "DEV_K", (8, 32))
    monkeypatch.setattr(paper_regime, "TAUS", (0.8,))
    settings = paper_regime.RegimeSettings("tiny-llama", data, tmp_path / "out", ["1950"])
    heads = HeadSet([(1, 0), (2, 1)])
    lines: list[str] = []
    paper_regime.run_regime(tiny_llama, heads, settings, ["dev", "tau", "choose", "test"], log=lines.append)
    choice = json.loads(settings.choice_path.read_text())
    swept = paper_regime.dev_methods(400).values()
    assert choice["tau"] == 0.8 and budget_study.chosen_config(choice["config"], 400) in swept
    assert settings.store("test", "path_traversal", "1950", "tf").is_file()
    assert len(lines) == 5 and "chosen on the dev split" in lines[3]
    assert all("new records" in line for line in lines[:3] + lines[4:])
    # a second call finds every record stored
    again: list[str] = []
    paper_regime.run_regime(tiny_llama, heads, settings, ["test"], log=again.append)
    assert " 0 new records" in again[0]
    # free and format-forced decoding of one free/ instance, each in its own store
    save_dataset(data / "free" / "path_traversal_1950.jsonl",
                 make_dataset("path_traversal", tiny_llama.tokenizer, 1950, n=1, seed=0, progress=False))
    decoded: list[str] = []
    paper_regime.run_regime(tiny_llama, heads, settings, ["free", "format-forced"], log=decoded.append)
    assert len(decoded) == 2 and all(" 4 new records" in line for line in decoded)
    free, ff = (settings.store("test", "path_traversal", "1950", kind) for kind in ("free", "ff"))
    assert "decoding" not in read_header(free)["settings"]
    assert read_header(ff)["settings"]["decoding"] == FORMAT_FORCED
    with pytest.raises(ConfigError, match="--yarn"):
        paper_regime.run_regime(tiny_llama, heads, settings, ["yarn-cost"])
    with pytest.raises(ConfigError, match="unknown part"):
        paper_regime.run_regime(tiny_llama, heads, settings, ["sweep"])


def test_the_report_redraws_the_committed_tables_and_figures_from_the_stores(tmp_path):
    import shutil
    from pathlib import Path

    from dysco_interp.studies.paper_regime_report import MOTIVATION, write_reports

    figures = Path(__file__).resolve().parents[1] / "figures"
    folder = tmp_path / "paper_regime"
    shutil.copytree(figures / "paper_regime", folder, ignore=shutil.ignore_patterns("*.md", "*.json", "*.png",
                                                                                    "*.html"))
    for chosen in (figures / "paper_regime").glob("chosen_*.json"):
        shutil.copy(chosen, folder)
    (tmp_path / MOTIVATION).mkdir()
    shutil.copy(figures / MOTIVATION / "motivation.jsonl.xz", tmp_path / MOTIVATION)
    written = write_reports(folder)
    for name in ("test_tf.json", "yarn_cost.json", "free.json", "tasks.json", "dev_choice.md"):
        assert json.loads((folder / name).read_text()) == json.loads((figures / "paper_regime" / name).read_text()) \
            if name.endswith(".json") else (folder / name).read_text() == (figures / "paper_regime" / name).read_text()
    # a figure per model; the gold edge's rank only where its read-outs ran (the 1.5B)
    assert {Path(w).name for w in written} >= {f"effect_qwen2.5-coder-{m}b.{x}" for m in ("0.5", "1.5")
                                              for x in ("png", "html")} | {"gold_rank_qwen2.5-coder-1.5b.png",
                                                                          "qwen2.5-coder-1.5b.png"}
    assert (folder / "tasks.md").read_text() == (figures / "paper_regime" / "tasks.md").read_text()
    shutil.rmtree(folder / "test")
    for chosen in folder.glob("chosen_*.json"):
        chosen.unlink()
    with pytest.raises(ConfigError, match="choose part"):
        write_reports(folder)


@pytest.mark.parametrize("model, n_cells", [("qwen2.5-coder-1.5b", 8), ("qwen2.5-coder-0.5b", 6)])
def test_the_committed_choice_follows_from_the_committed_dev_stores(tmp_path, model, n_cells):
    import shutil
    from pathlib import Path

    figures = Path(__file__).resolve().parents[1] / "figures"
    shutil.copytree(figures / "paper_regime" / "dev", tmp_path / "paper_regime" / "dev")
    settings = paper_regime.RegimeSettings(model, tmp_path, tmp_path, [], budget_dev=figures / "budget" / "dev")
    ours = paper_regime.choose(settings)
    committed = json.loads((figures / "paper_regime" / f"chosen_{model}.json").read_text())
    assert ours == committed
    assert ours["config"] == {"beta": 1.5, "top_p": 0.975, "top_k": 8, "top_k_fraction": None}
    # Path Traversal and MRCR-style at 2K, 8K and 31K; at 127K (YaRN) only for the 1.5B, the 0.5B kept to its card
    assert len(ours["cells"]) == n_cells
