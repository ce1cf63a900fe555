"""dysco-gated: DySCO that scales a step only when the selected keys hold enough relevance."""

import pytest

from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import compare_methods
from dysco_interp.decoding.methods import SelectionParams
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet

N_NEW = 16
PROMPT = ("You can travel from Paris to Berlin by train. Rome is quiet. " * 6
          + "Please give a route from Paris to Berlin.")


def heads_for(model):
    s = model.spec
    return HeadSet([(1, 0), (2, 3), (1, 2)], model=s.name, n_layers=s.n_layers, n_heads=s.n_heads,
                   n_kv_heads=s.n_kv_heads)


def gated(min_mass: float) -> DecodingConfig:
    return DecodingConfig(method="dysco-gated", params={"beta": 4.0, "select_p": 0.7, "min_mass": min_mass},
                          max_new_tokens=N_NEW, record_positions=True)


@pytest.mark.parametrize("backend", ["bridge", "static"])
def test_the_gate_open_is_dysco_and_shut_is_vanilla_and_between_it_mixes(tiny_llama, backend):
    heads = heads_for(tiny_llama)
    runs = compare_methods(tiny_llama, PROMPT, {
        "vanilla": DecodingConfig(method="vanilla", max_new_tokens=N_NEW),
        "dysco": DecodingConfig(params=SelectionParams(beta=4.0, select_p=0.7), max_new_tokens=N_NEW,
                                record_positions=True),
        "open": gated(0.0), "shut": gated(1.01)}, heads, backend=backend)
    assert runs["dysco"].tokens != runs["vanilla"].tokens  # else the test could not tell them apart
    assert runs["open"].tokens == runs["dysco"].tokens
    assert [s.selected for s in runs["open"].trace.steps] == [s.selected for s in runs["dysco"].trace.steps]
    assert runs["shut"].tokens == runs["vanilla"].tokens
    assert all(s.n_selected == 0 and s.nucleus_mass == 0 for s in runs["shut"].trace.steps if s.n_selected is not None)
    # a threshold inside the masses DySCO's steps had: some steps scaled, some not
    masses = sorted(s.nucleus_mass for s in runs["dysco"].trace.steps if s.nucleus_mass is not None)
    middle = masses[len(masses) // 2]
    mixed = compare_methods(tiny_llama, PROMPT, {"mixed": gated(middle)}, heads, backend=backend)["mixed"]
    scaled = [s.n_selected > 0 for s in mixed.trace.steps if s.n_selected is not None]
    assert any(scaled) and not all(scaled)


@pytest.mark.parametrize("bad", [-0.1, "0.5", True, float("nan")])
def test_a_bad_min_mass_is_refused_when_the_config_is_made(bad):
    with pytest.raises(ConfigError, match="min_mass"):
        gated(bad)
