"""CUDA-graph replay of the static backend equals its eager run (needs a CUDA device)."""

import pytest
import torch

from dysco_interp.decoding.dysco import generate_batch
from dysco_interp.decoding.static import StaticBackend
from dysco_interp.models.tiny import STYLES, tiny_model
from test_backends import METHODS, OTHERS, PROMPT, heads_for, selections

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@pytest.mark.parametrize("style", STYLES)
def test_replayed_graphs_give_the_eager_tokens_and_selections(style, monkeypatch):
    model = tiny_model(style, device="cuda")
    heads = heads_for(model)
    prompts = [PROMPT, *OTHERS]
    replayed = generate_batch(model, prompts, METHODS, heads, backend="static")
    monkeypatch.setattr(StaticBackend, "__init__", _eager_init)
    eager = generate_batch(model, prompts, METHODS, heads, backend="static")
    sdpa = generate_batch(model, prompts, METHODS, heads, backend="sdpa")
    for name in METHODS:
        for ours, ref, other in zip(replayed[name], eager[name], sdpa[name]):
            assert ours.tokens == ref.tokens == other.tokens, name
            assert selections(ours) == selections(ref) == selections(other), name


_init = StaticBackend.__init__


def _eager_init(self, model, heads, tau=1.0):
    _init(self, model, heads, tau, graphs=False)
