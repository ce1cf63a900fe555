"""Read-outs: any heads' attention rows, or their mass over spans, at every step, for any method and
on every backend, without a full pattern, and without changing what is decoded."""

import pytest
import torch

from dysco_interp import DecodingConfig, Read, generate, observe
from dysco_interp.decoding.config import with_flat
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet

PROMPT = "You can travel from Paris to Berlin by train. Rome is quiet. " * 4 + "Give a route from Paris to Berlin."
OBSERVED = ((0, 1), (3, 2), (2, 0))
SPANS = ((0, 5), (5, 20), (20, 40))


def qrheads(model):
    s = model.spec
    return HeadSet([(1, 0), (2, 3)], model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def config_of(method):
    # one set of values for every method: each takes those it has, the rest kept unowned
    return with_flat(DecodingConfig(method=method, max_new_tokens=6), {"beta": 3.0, "top_p": 0.8})


def observed_run(model, method, backend, returns):
    seen = []
    read = Read(OBSERVED, returns=returns, spans=SPANS if returns == "span_mass" else ())
    with observe(model, on_read=lambda step, out: seen.append((step, out))):
        res = generate(model, PROMPT, config_of(method),
                       heads=qrheads(model), backend=backend, read=read)
    return res, seen


@pytest.mark.parametrize("method", ["vanilla", "dysco", "dysco-reuse"])
def test_rows_are_the_bridge_s_on_every_backend_and_change_nothing(tiny, method):
    runs = {b: observed_run(tiny, method, b, "rows") for b in ("bridge", "sdpa", "static")}
    plain = generate(tiny, PROMPT, config_of(method),
                     heads=qrheads(tiny), backend="sdpa")
    ref_res, ref = runs["bridge"]
    assert len(ref) == len(ref_res.trace.steps)  # one read per step: the pass that keeps its token
    for backend, (res, seen) in runs.items():
        assert res.tokens == plain.tokens, backend
        assert [step for step, _ in seen] == [step for step, _ in ref]
        for (_, ours), (_, theirs) in zip(seen, ref):
            assert ours.rows is not None and ours.rows.shape == theirs.rows.shape
            assert ours.rows.shape[1] == len(OBSERVED)
            torch.testing.assert_close(ours.rows, theirs.rows, atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(ours.rows.sum(-1), torch.ones_like(ours.rows.sum(-1)), atol=1e-4, rtol=0)


def test_span_mass_is_the_rows_summed_and_lands_in_the_trace(tiny_of):
    model = tiny_of("qwen3")
    rows_res, rows = observed_run(model, "dysco", "static", "rows")
    mass_res, masses = observed_run(model, "dysco", "static", "span_mass")
    for (_, r), (_, m), rec in zip(rows, masses, mass_res.trace.steps):
        expected = torch.stack([r.rows[..., s:e].sum(-1) for s, e in SPANS], dim=-1)
        torch.testing.assert_close(m.span_mass, expected)
        assert rec.read_mass == [[round(x, 6) for x in head] for head in m.span_mass[0].tolist()]
    assert mass_res.tokens == rows_res.tokens


def test_a_read_out_outside_the_model_is_one_line_before_decoding(tiny_llama):
    with pytest.raises(ConfigError, match="outside the model"):
        generate(tiny_llama, PROMPT, max_new_tokens=2, read=Read(((99, 0),)))
    with pytest.raises(ConfigError, match="plan.Read"):
        generate(tiny_llama, PROMPT, max_new_tokens=2, read=[(0, 1)])
    with pytest.raises(ConfigError, match="needs spans"):
        Read(((0, 1),), returns="span_mass")
