"""The steering harness's protocol: its grids build before any model loads, and the dev rule
picks the point with the lowest mean rank of its paired gain over vanilla."""

import pytest

from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.errors import ConfigError
from dysco_interp.studies import harness_protocol as hp


def record(config: DecodingConfig, instance: str, value: float, task="path_traversal", length=2048, model="m"):
    params = None if config.params is None else config.params.as_dict()
    metric = {"path_traversal": "tf_step_accuracy"}.get(task, "tf_logprob")
    return {"model": model, "task": task, "length": length, "instance": instance, "config": config.record_fields(),
            "params": params, metric: value}


def cells(configs, gains, cells=(("path_traversal", 2048), ("mrcr", 8192))):
    """Records of vanilla at 0 and each config at its gain per cell, on two instances."""
    out = []
    for (task, length), cell_gains in zip(cells, zip(*gains)):
        for i in ("a", "b"):
            out.append(record(DecodingConfig(method="vanilla"), i, 0.0, task, length))
            out += [record(c, i, g, task, length) for c, g in zip(configs, cell_gains)]
    return out


def test_every_grid_builds_within_the_limit():
    for method, grid in hp.GRIDS.items():
        configs = hp.check_grid(method, grid)
        assert 1 <= len(configs) <= hp.MAX_GRID and all(c.method == method for c in configs)
    assert [c.params.tau for c in hp.grid_of("uniattns")] == [0.975, 0.95, 0.9, 0.85]
    assert hp.grid_of("dysco")[0] == DecodingConfig()  # the small budget first: the gentlest
    assert hp.grid_of("dysco-static") == (DecodingConfig(method="dysco-static"),)  # no grid: its defaults


def test_the_lowest_mean_rank_wins_and_a_tie_goes_to_the_gentlest():
    configs = hp.grid_of("dysco")
    # point 1 is best in one cell and worst in the other (mean rank 3); point 2 second and first (1.5)
    gains = [(0.0, 0.0), (0.5, -0.5), (0.2, 0.1), (0.1, 0.0), (-0.1, -0.2)]
    choice = hp.choose(cells(configs, gains), "m", "dysco")
    assert choice["point"] == {"beta": 2.0} and choice["mean_rank"] == 1.5
    ranks = {str(row["point"]): row["mean_rank"] for row in choice["ranking"]}
    assert ranks == {"{'beta': 2.0}": 1.5, "{'select_k': 32, 'beta': 2.0}": 2.75, "{'select_k': 32}": 3.0, "{}": 3.25,
                     "{'select_k': 4096, 'beta': 2.0}": 4.5}
    assert choice["cells"] == ["m/mrcr/8192", "m/path_traversal/2048"] and choice["rule"] == hp.RULE
    # every point equal: the first listed
    tied = hp.choose(cells(configs, [(0.1, 0.1)] * len(configs)), "m", "dysco")
    assert tied["point"] == {}


def test_a_point_missing_from_a_cell_is_no_candidate():
    configs = hp.grid_of("uniattns")
    records = cells(configs, [(0.1, 0.1), (0.3, 0.3), (0.0, 0.0), (0.0, 0.0)])
    best = configs[1]
    records = [r for r in records if not (r["params"] == best.params.as_dict() and r["task"] == "mrcr")]
    choice = hp.choose(records, "m", "uniattns")
    assert choice["point"] == {"tau": 0.975} and len(choice["ranking"]) == 3
    with pytest.raises(ConfigError, match="no grid point of 'uniattns' was run with vanilla on every dev cell of x"):
        hp.choose(records, "x", "uniattns")


@pytest.mark.parametrize("grid, message", [
    ((), "empty grid"),
    (tuple({"beta": 1.0 + i / 10} for i in range(7)), "7 grid points; the protocol allows at most 6"),
    (({"beta": 2.0}, {"beta": 2.0}), "lists one grid point twice"),
    (({"select_k": 0},), "select_k must be"),
    (({"alpha": 1},), "has no parameter 'alpha'"),
])
def test_a_bad_grid_is_one_line_before_any_model_loads(grid, message):
    with pytest.raises(ConfigError, match=message):
        hp.check_grid("dysco", grid)


def test_a_method_s_instruction_is_bound_per_task_and_its_point_found_in_every_task():
    from dysco_interp.tasks.needle_qa.instance import INSTRUCTION

    needle = hp.bind("instaboost", {"M": 3.0}, "needle_qa")
    assert needle.params.M == 3.0 and INSTRUCTION in needle.params.instruction
    assert hp.bind("instaboost", {}, "mrcr").params.instruction == ()  # MRCR's instruction is its last message
    assert hp.bind("instaboost", {"instruction": ["mine"]}, "needle_qa").params.instruction == ("mine",)
    # the same point binds to other texts per task, and the rule still sees one point across the cells
    grid = ({"M": 3.0}, {"M": 9.0})
    records = []
    for task, length in (("path_traversal", 2048), ("needle_qa", 8192)):
        for i in ("a", "b"):
            records.append(record(DecodingConfig(method="vanilla"), i, 0.0, task, length))
            records += [record(hp.bind("instaboost", p, task), i, g, task, length) for p, g in zip(grid, (0.1, 0.2))]
    choice = hp.choose(records, "m", "instaboost", {"instaboost": grid})
    assert choice["point"] == {"M": 9.0} and choice["label"] == "instaboost M=9.0" and len(choice["cells"]) == 2


def test_a_profiled_point_needs_a_count_and_a_method_with_heads():
    with pytest.raises(ConfigError, match="has no parameter 'heads'"):
        hp.bind("dysco", {hp.PROFILED: 4}, "mrcr")
    with pytest.raises(ConfigError, match="positive whole number"):
        hp.check_grid("instaboost", ({hp.PROFILED: 0},))
