"""The method key of a stored record follows the method registry and the paper preset's values."""

import dataclasses

import pytest

from dysco_interp.analysis import method_key as mk
from dysco_interp.analysis.method_key import MethodKey, key_fields, method_key
from dysco_interp.decoding import methods
from dysco_interp.decoding.config import PRESETS, DecodingConfig, preset

# the shared settings and the flat parameters a record keeps beside them
CONFIG_FIELDS = {f.name for f in dataclasses.fields(DecodingConfig)} | methods.FLAT_FIELDS


@pytest.mark.parametrize("name", list(methods.REGISTRY))
def test_a_key_holds_the_registry_fields_of_its_method(name):
    strategy = methods.REGISTRY[name]
    fields = set(key_fields(name))
    # every field the registry gives the method, and besides them only the warm-up of a method that
    # keeps relevance: a field the method does not use would split its runs into two rows
    assert fields - strategy.fields == ({"warmup"} if strategy.uses_heads else set())
    assert strategy.fields <= fields
    # and the warm-up is a field every method shares, not one the registry gives any method
    assert "warmup" not in methods.METHOD_FIELDS and "warmup" in DecodingConfig(method=name).used_fields()


def value_of(config, field):
    # a key field of a config: a shared setting, or a parameter by its record name
    return config.parameter(methods.param_name(field)) if field in methods.FLAT_FIELDS else getattr(config, field)


@pytest.mark.parametrize("name", list(methods.REGISTRY))
def test_a_paper_run_has_the_keys_defaults(name):
    config = preset("paper", method=name)
    key = method_key({"config": dataclasses.asdict(config)})
    # a method's own options follow its fields, at their declared defaults (dysco-gated's min_mass)
    options = {k.removeprefix("options."): v for k, v in key.params if k.startswith("options.")}
    assert options == dict(methods.REGISTRY[name].options)
    fields = [(k, v) for k, v in key.params if not k.startswith("options.")]
    assert [k for k, _ in fields] == list(key_fields(name))
    for field, value in fields:
        assert mk.default_value(field) == value_of(PRESETS["paper"], field)
        assert value == (0.0 if field == "top_k_fraction" else value_of(config, field))  # 0.0: no cap by share
    assert key.is_default and not key.deviations()


def test_no_field_is_named_that_no_method_uses():
    # the module's own tables (symbols, legacy spellings, protocol fields, the robustness study) name
    # only fields some method's key holds: no method field restated beside the registry
    used = {f for name in methods.REGISTRY for f in key_fields(name)}
    assert used <= CONFIG_FIELDS
    for table in (mk.SYMBOLS, mk.PROTOCOL_FIELDS, mk.ROBUSTNESS_PARAMS, mk.ALWAYS_SHOWN):
        assert set(table) <= used, table
    assert set(mk.SYMBOLS) == used  # and every key field has its symbol in labels
    assert not hasattr(mk, "METHOD_PARAMS")


def test_vanilla_and_uniattns_keys_ignore_the_warm_up():
    # the warm-up only moves where their prefill stops: one method, so one key
    vanilla = {"config": {**dataclasses.asdict(DecodingConfig(method="vanilla")), "warmup": 16}}
    assert method_key(vanilla) == MethodKey("vanilla")
    dysco = method_key({"config": {**dataclasses.asdict(preset("paper")), "warmup": 16}})
    assert dysco.deviations() == {"warmup": 16} and dysco.label == "DySCO (T_w=16)"


def test_a_method_registered_later_has_its_key(monkeypatch):
    class Wider(methods.Dysco):
        name = "dysco-wider"
        description = "a method registered at run time"

    monkeypatch.setitem(methods.REGISTRY, Wider.name, Wider)
    key = method_key({"config": {"method": Wider.name, "top_p": 0.9}})
    assert [k for k, _ in key.params] == list(key_fields("dysco"))
    assert key.label == "dysco-wider (p=0.9, schedule=paper, template masking=skeleton)"  # a record without them


def test_records_keep_their_labels_whatever_decoding_configs_defaults():
    # a record written with the paper's values (explicit, as every record is) reads as the paper's run;
    # one lacking them was written when they were the defaults; today's default reads as the small budget
    paper = {"config": dataclasses.asdict(preset("paper"))}
    assert method_key(paper).is_default and method_key(paper).label == "DySCO"
    old = {"config": {k: v for k, v in paper["config"].items() if k not in ("beta", "top_k")}}
    assert method_key(old) == method_key(paper)
    default = method_key({"config": dataclasses.asdict(DecodingConfig())})
    assert default == method_key({"config": dataclasses.asdict(preset("small-budget"))})
    assert default.deviations() == {"beta": 1.5, "top_k": 8} and default.label == "DySCO (beta=1.5, K=8)"


@pytest.mark.parametrize("name", ["vanilla", "uniattns", "dysco", "dysco-random", "dysco-gated"])
def test_a_record_keyed_by_its_params_has_its_flat_configs_key(name):
    config = preset("paper", method=name)
    if config.params is not None and "select_k" in config.params.as_dict():
        config = config.with_params(select_k=16, beta=3.0)
    elif name == "uniattns":
        config = config.with_params(tau=0.9)
    params = None if config.params is None else config.params.as_dict()
    flat_only = {"config": config.record_fields()}
    key = method_key({**flat_only, "params": params})
    assert key == method_key(flat_only)
    # the params decide where the two disagree: the flat form is only what older records have
    if params is not None and "beta" in params:
        assert method_key({"config": {**config.record_fields(), "beta": 9.0}, "params": params}) == key
