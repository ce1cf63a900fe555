"""The attention replay of a researcher's own method: its trace's per-step selections become the
"selected" row, named after the method, for a two-pass method and for a prompt-only one."""

import math

import matplotlib.pyplot as plt
import pytest
import torch

from dysco_interp import DecodingConfig, SteeringMethod, register_method
from dysco_interp.analysis.replay import replay_path_traversal
from dysco_interp.decoding import methods
from dysco_interp.decoding.loop import compare_methods
from dysco_interp.heads import HeadSet
from dysco_interp.models.tiny import tiny_model
from dysco_interp.tasks.path_traversal import generate_instance
from dysco_interp.viz.replay_view import replay_figure, replay_snapshot, selector_name

TAIL = 12  # the prompt's last tokens, which the prompt-only method leaves alone


class AboveQRHeads(SteeringMethod):
    name = "replay-above-qrheads"
    description = "DySCO's bias in the layers after the deepest QRHead only, in two passes"

    def bias_layers(self):
        return range(max(layer for layer, _ in self.heads) + 1, self.spec.n_layers)


class Damped(SteeringMethod):
    name = "replay-damped"
    description = "every prompt key but the last few scaled by alpha in two heads (PASTA's shape)"
    step_shape = "bias-only"
    fields = frozenset({"schedule"})
    options = {"alpha": 0.5}

    def bias_heads(self):
        return [(1, 0), (2, 3)]

    def start(self, model, batch):
        outside = torch.zeros(batch.ids.shape, dtype=torch.bool)
        for row, (prepared, pad) in enumerate(zip(batch.prepared, batch.pads)):
            outside[row, pad:pad + len(prepared.ids) - TAIL] = True
        self.outside = outside.to(model.device)

    def select(self, relevance, n_keys):
        return torch.nn.functional.pad(self.outside, (0, n_keys - self.outside.shape[-1]))[:, :n_keys]

    def bias(self, selected):
        return torch.where(selected, math.log(self.option("alpha")), 0.0)[:, None, None, :].float()


@pytest.fixture(scope="module")
def runs():
    for cls in (AboveQRHeads, Damped):
        register_method(cls)
    model = tiny_model("llama", max_position_embeddings=4096)
    inst = generate_instance(model.tokenizer, 1950, seed=1, hops=2)
    s = model.spec
    heads = HeadSet([(1, 0), (2, 3)], model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)
    configs = {name: DecodingConfig(method=name, max_new_tokens=6, record_positions=True)
               for name in ("dysco-reuse", AboveQRHeads.name, Damped.name)}
    out = compare_methods(model, inst.prompt, configs, heads)
    yield {name: replay_path_traversal(model, inst, result, heads) for name, result in out.items()}, inst
    for cls in (AboveQRHeads, Damped):
        methods.REGISTRY.pop(cls.name, None)
        methods.METHODS.pop(cls.name, None)


def test_a_two_pass_method_replays_as_dysco_reuse_does(runs):
    replays, inst = runs
    ours, reuse = replays[AboveQRHeads.name], replays["dysco-reuse"]
    assert ours.method == AboveQRHeads.name and ours.tokens == reuse.tokens
    assert ours.selected is not None and ours.selected.shape == (len(ours), inst.n_edges)
    torch.testing.assert_close(ours.selected, reuse.selected, equal_nan=True)
    torch.testing.assert_close(ours.qr_heads, reuse.qr_heads)


def test_a_prompt_only_method_shows_the_keys_it_biases(runs):
    replays, inst = runs
    damped = replays[Damped.name]
    # every edge line lies before the prompt's last tokens: all of it is biased at every step
    assert damped.selected is not None and damped.selected.shape == (len(damped), inst.n_edges)
    assert bool((damped.selected == 1).all())


def test_the_figure_names_the_method_that_selected(runs):
    replays, _ = runs
    assert selector_name(replays["dysco-reuse"]) == "DySCO"
    assert selector_name(replays[Damped.name]) == Damped.name
    shown = {"dysco-reuse": replays["dysco-reuse"], "damped": replays[Damped.name]}
    assert selector_name(shown) == f"DySCO / {Damped.name}"
    fig = replay_figure(shown)
    titles = [fig.layout[name].title.text for name in fig.layout if name.startswith("yaxis")]
    assert f"DySCO / {Damped.name}<br>selected" in titles
    legend = [t.name for t in fig.data if t.name]
    assert f"DySCO / {Damped.name} selected that share of the span" in legend
    snapshot = replay_snapshot({"damped": replays[Damped.name]})
    assert snapshot.axes[2].get_ylabel() == f"{Damped.name}\nselected"  # rows: QRHeads, all heads, selected
    plt.close(snapshot)
