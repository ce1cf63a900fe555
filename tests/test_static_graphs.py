"""CUDA-graph replay of the static backend equals its eager run (needs a CUDA device)."""

import pytest
import torch

from dysco_interp.decoding.loop import generate_batch
from dysco_interp.models.tiny import STYLES, tiny_model
from test_backends import METHODS, OTHERS, PROMPT, heads_for, selections

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@pytest.mark.parametrize("style", STYLES)
def test_replayed_graphs_give_the_eager_tokens_and_selections(style):
    model = tiny_model(style, device="cuda")
    heads = heads_for(model)
    prompts = [PROMPT, *OTHERS]
    replayed = generate_batch(model, prompts, METHODS, heads, backend="static", graphs=True)
    eager = generate_batch(model, prompts, METHODS, heads, backend="static", graphs=False)
    sdpa = generate_batch(model, prompts, METHODS, heads, backend="sdpa")
    for name in METHODS:
        for ours, ref, other in zip(replayed[name], eager[name], sdpa[name]):
            assert ours.tokens == ref.tokens == other.tokens, name
            assert selections(ours) == selections(ref) == selections(other), name

