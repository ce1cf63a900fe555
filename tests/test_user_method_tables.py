"""Records of a researcher's own method in the tables: its options are part of what ran, so two
values of an option are two rows, each labelled with the options it moved off their defaults."""

import pytest

from dysco_interp import DecodingConfig, SteeringMethod, register_method
from dysco_interp.analysis.method_key import MethodKey, method_key
from dysco_interp.analysis.result_tables import ablation_table, group, pt_table, robustness_points
from dysco_interp.decoding import methods
from dysco_interp.errors import ConfigError


class Scaled(SteeringMethod):
    """Options only: the tables never run it."""

    name = "table-scaled"
    description = "a steering method with options of every JSON kind"
    step_shape = "bias-only"
    fields = frozenset({"schedule"})
    options = {"alpha": 0.01, "heads": [[1, 0], [2, 3]], "note": "x", "spans": {"b": [1, 2], "a": 0}}


@pytest.fixture
def registered():
    register_method(Scaled)
    yield Scaled
    methods.REGISTRY.pop(Scaled.name, None)
    methods.METHODS.pop(Scaled.name, None)


def record(method: str = Scaled.name, instance: int = 0, accuracy: float = 1.0, **options) -> dict:
    config = DecodingConfig(method=method, max_new_tokens=8, params=options)
    return {"model": "tiny-llama", "task": "path_traversal", "length": 1950, "method": method, "index": instance,
            "instance": f"i{instance}", "accuracy": accuracy, "step_accuracy": accuracy, "partial_accuracy": accuracy,
            "extraction_rate": 1.0, "config": config.record_fields()}


def test_each_option_value_is_a_key_of_its_own_with_a_label_that_names_it(registered):
    default, moved = method_key(record()), method_key(record(alpha=0.05))
    assert default != moved and default.is_default and not moved.is_default
    assert default.label == "table-scaled" and moved.label == "table-scaled (alpha=0.05)"
    assert moved.value("options.alpha") == 0.05 and moved.params_dict()["options.heads"] == ((1, 0), (2, 3))
    # lists and objects are hashable in a key and shown as JSON; 1 and 1.0 are one alpha
    assert method_key(record(heads=[[3, 1]], spans={"a": 1})).label == \
        'table-scaled (heads=[[3,1]], spans=[["a",1]])'
    assert method_key(record(alpha=1)) == method_key(record(alpha=1.0))
    assert len({default, moved, method_key(record(alpha=0.05))}) == 2
    # a record written before the method had options ran its defaults
    older = record()
    del older["config"]["options"]
    assert method_key(older) == default


def test_options_do_not_collide_with_config_fields(registered):
    key = method_key(record(alpha=0.5))
    assert [name for name, _ in key.params] == ["schedule", "options.alpha", "options.heads", "options.note",
                                                 "options.spans"]
    assert MethodKey("vanilla") == method_key(record("vanilla"))  # built-in methods have no option entries


def test_the_tables_group_a_users_method_by_its_options_and_leave_it_out_of_the_papers_tables(registered):
    records = [record("vanilla", i, 0.0) for i in range(3)]
    records += [record(instance=i, alpha=a) for i in range(3) for a in (0.01, 0.05)]
    [(cell, by_key)] = group(records).items()
    assert cell.length == 1950
    assert sorted(k.label for k in by_key) == ["table-scaled", "table-scaled (alpha=0.05)", "vanilla"]
    assert all(len(recs) == 3 for recs in by_key.values())
    # the paper's tables (vanilla / UniAttnS / DySCO, its ablations, its robustness) run unchanged beside it
    rows, notes = pt_table(records, {})
    assert [r["method"] for r in rows] == ["vanilla"] and any("no DySCO records" in n for n in notes)
    assert ablation_table(records)[0] == [] and robustness_points(records)[0] == []


def test_a_record_of_a_method_not_registered_says_how_to_read_it():
    with pytest.raises(ConfigError, match="unknown config method 'table-other'.*--methods-from FILE.py"):
        method_key({"config": {"method": "table-other"}})
