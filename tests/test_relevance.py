"""DySCO's relevance math, checked against values computed by hand."""

import math

import pytest
import torch

from dysco_interp.decoding.relevance import (
    aggregate_heads,
    history_weight,
    scaling_bias,
    select_keys,
    update_relevance,
    window_slice,
)
from dysco_interp.errors import ConfigError

# --------------------------------------------------------------------------- aggregate


def test_aggregate_heads_means_over_all_heads_and_right_aligns_windows():
    full = torch.tensor(
        [
            [[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]],  # batch row 0, two heads
            [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]],  # batch row 1
        ]
    )
    window = torch.tensor([[[0.25, 0.75]], [[0.5, 0.5]]])  # one head seeing the last 2 keys
    out = aggregate_heads([full, window], n_keys=4)
    expected = torch.tensor(
        [
            [0.5 / 3, 0.5 / 3, (0.5 + 0.25) / 3, (0.5 + 0.75) / 3],
            [1.0 / 3, 0.0, 0.5 / 3, 1.5 / 3],
        ]
    )
    torch.testing.assert_close(out, expected)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.sum(-1), torch.ones(2))


def test_aggregate_heads_explicit_offsets_and_bf16_rows():
    row = torch.tensor([[[0.5, 0.5]]], dtype=torch.bfloat16)
    out = aggregate_heads([row], n_keys=5, offsets=[1])
    assert out.dtype == torch.float32
    assert out.tolist() == [[0.0, 0.5, 0.5, 0.0, 0.0]]


def test_aggregate_heads_rejects_rows_that_do_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        aggregate_heads([torch.ones(1, 1, 6) / 6], n_keys=5)
    with pytest.raises(ValueError, match="does not fit"):
        aggregate_heads([torch.ones(1, 1, 2) / 2], n_keys=5, offsets=[4])
    with pytest.raises(ValueError, match="at least one"):
        aggregate_heads([], n_keys=5)


# --------------------------------------------------------------------------- momentum


def test_update_relevance_by_hand():
    a = torch.tensor([[0.5, 0.3, 0.2]])
    prev = torch.tensor([[0.6, 0.4]])  # one key fewer: padded with 0 for the new key
    r = update_relevance(a, prev, decay=0.75)
    torch.testing.assert_close(r, torch.tensor([[0.95, 0.6, 0.2]]) / 1.75)
    torch.testing.assert_close(r.sum(), torch.tensor(1.0))
    # the same in the gamma form: (1 - gamma) a + gamma r_prev
    gamma = history_weight(0.75)
    assert gamma == pytest.approx(3 / 7)
    torch.testing.assert_close(r, (1 - gamma) * a + gamma * torch.tensor([[0.6, 0.4, 0.0]]))


def test_first_update_is_the_attention_itself():
    a = torch.tensor([[0.25, 0.75]], dtype=torch.bfloat16)
    r = update_relevance(a, None, decay=0.75)
    assert r.dtype == torch.float32 and r.tolist() == [[0.25, 0.75]]
    r[0, 0] = 9.0
    assert a[0, 0].item() == 0.25  # a copy, not a view


def test_decay_zero_forgets_history_and_several_new_keys_pad():
    a = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    assert torch.equal(update_relevance(a, torch.tensor([[1.0, 0.0]]), decay=0.0), a)
    r = update_relevance(a, torch.tensor([[1.0, 0.0]]), decay=1.0)
    torch.testing.assert_close(r, torch.tensor([[0.55, 0.1, 0.15, 0.2]]))


def test_relevance_stays_normalised_over_many_steps():
    gen = torch.Generator().manual_seed(0)
    r = None
    for n in range(5, 300):
        a = torch.softmax(torch.randn(3, n, generator=gen) * 4, dim=-1)
        r = update_relevance(a, r, decay=0.75)
    assert r.dtype == torch.float32
    torch.testing.assert_close(r.sum(-1), torch.ones(3), atol=1e-5, rtol=0)


@pytest.mark.parametrize("decay", [-0.1, float("nan"), float("inf"), "0.5"])
def test_bad_decay_is_refused(decay):
    with pytest.raises(ConfigError, match="decay"):
        update_relevance(torch.ones(1, 2) / 2, None, decay)


def test_update_rejects_mismatched_history():
    with pytest.raises(ValueError, match="does not fit"):
        update_relevance(torch.ones(1, 2) / 2, torch.ones(1, 3) / 3, 0.75)
    with pytest.raises(ValueError, match="does not fit"):
        update_relevance(torch.ones(2, 3) / 3, torch.ones(1, 2) / 2, 0.75)


# --------------------------------------------------------------------------- selection

# Dyadic values: cumulative sums are exact in float32, so the <= p boundary is too.
R = torch.tensor([[0.125, 0.5, 0.125, 0.25]])  # descending: 1 (.5), 3 (.25), 0 (.125), 2 (.125)


def chosen(sel):
    return [torch.nonzero(row).flatten().tolist() for row in sel.mask]


@pytest.mark.parametrize(
    "top_p, top_k, expected",
    [
        (0.75, 4096, [1, 3]),  # cumulative 0.5, 0.75: equal to p is kept
        (0.74, 4096, [1]),
        (0.1, 4096, [1]),  # below the first key's mass: still one token
        (0.875, 4096, [0, 1, 3]),  # tie at 0.125: the earlier position (0) ranks first
        (1.0, 4096, [0, 1, 2, 3]),
        (1.0, 2, [1, 3]),  # nucleus holds 4 > K=2: keep the top 2
        (1.0, 3, [0, 1, 3]),
        (0.75, 1, [1]),
    ],
)
def test_select_keys_by_hand(top_p, top_k, expected):
    sel = select_keys(R, top_p, top_k)
    assert chosen(sel) == [expected]
    assert sel.count.tolist() == [len(expected)]
    assert sel.mass.item() == pytest.approx(R[0, expected].sum().item())
    assert sel.mask.dtype == torch.bool


def test_exclusion_comes_after_selection():
    exclude = torch.tensor([False, False, False, True])
    sel = select_keys(R, 0.75, 4096, exclude=exclude)
    # 3 was in the nucleus and is dropped; nothing refills its place
    assert chosen(sel) == [[1]]
    assert sel.count.tolist() == [1] and sel.mass.item() == 0.5
    # everything excluded: an empty selection, not an error
    sel = select_keys(R, 0.1, 4096, exclude=torch.tensor([[False, True, False, False]]))
    assert sel.count.tolist() == [0] and sel.mass.item() == 0.0


def test_selection_is_per_batch_row():
    r = torch.tensor([[0.125, 0.5, 0.125, 0.25], [0.5, 0.0, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]])
    exclude = torch.tensor([[False] * 4, [True, False, False, False], [False] * 4])
    sel = select_keys(r, 0.75, 2, exclude=exclude)
    assert chosen(sel) == [[1, 3], [2], [0, 1]]
    assert sel.count.tolist() == [2, 1, 2]
    torch.testing.assert_close(sel.mass, torch.tensor([0.75, 0.25, 0.5]))


def _reference_select(r, p, k, exclude):
    # One row at a time, plain Python, same rules.
    out = []
    for row, ex in zip(r.tolist(), exclude.tolist()):
        order = sorted(range(len(row)), key=lambda j: (-row[j], j))
        kept, cum = [], 0.0
        for j in order:
            cum = float(torch.tensor(cum + row[j], dtype=torch.float32))
            if kept and cum > float(torch.tensor(p, dtype=torch.float32)):
                break
            kept.append(j)
        kept = kept[:k]
        out.append(sorted(j for j in kept if not ex[j]))
    return out


def test_select_keys_matches_a_loop_reference_on_random_rows():
    gen = torch.Generator().manual_seed(3)
    # quantised relevances create many ties
    logits = torch.randint(0, 6, (6, 50), generator=gen).float()
    r = torch.softmax(logits, dim=-1)
    exclude = torch.rand(6, 50, generator=gen) < 0.2
    for p, k in [(0.5, 4096), (0.9, 7), (0.975, 20), (0.3, 1)]:
        assert chosen(select_keys(r, p, k, exclude)) == _reference_select(r, p, k, exclude)


@pytest.mark.parametrize("top_p", [0, -0.5, 1.01, float("nan"), "0.9", True])
def test_bad_top_p_is_refused(top_p):
    with pytest.raises(ConfigError, match="top_p"):
        select_keys(R, top_p, 10)


@pytest.mark.parametrize("top_k", [0, -3, 2.5, True, None])
def test_bad_top_k_is_refused(top_k):
    with pytest.raises(ConfigError, match="top_k"):
        select_keys(R, 0.9, top_k)


def test_select_rejects_bad_shapes():
    with pytest.raises(ValueError, match="batch, n_keys"):
        select_keys(R[0], 0.9, 10)
    with pytest.raises(ValueError, match="exclude"):
        select_keys(R, 0.9, 10, exclude=torch.zeros(3, dtype=torch.bool))


# --------------------------------------------------------------------------- bias


def test_scaling_bias_boosts_selected_and_current_key():
    selected = torch.tensor([[True, False, False, False, False], [False, False, True, False, True]])
    bias = scaling_bias(selected, beta=2.0)
    assert bias.shape == (2, 1, 1, 5) and bias.dtype == torch.float32
    log2 = math.log(2.0)
    expected = torch.tensor([[log2, 0, 0, 0, log2], [0, 0, log2, 0, log2]])
    torch.testing.assert_close(bias[:, 0, 0], expected)
    # adding it multiplies the boosted keys' weights by beta before renormalising
    scores = torch.tensor([0.0, 1.0, -1.0, 0.5, 2.0])
    w = torch.exp(scores) * torch.tensor([2.0, 1, 1, 1, 2])
    torch.testing.assert_close(torch.softmax(scores + bias[0, 0, 0], -1), w / w.sum())
    assert selected[0, -1].item() is False  # the input mask is not modified


def test_scaling_bias_without_current_and_beta_one():
    selected = torch.tensor([[False, True, False]])
    assert scaling_bias(selected, 3.0, boost_current=False)[0, 0, 0].tolist() == pytest.approx([0, math.log(3), 0])
    assert torch.equal(scaling_bias(selected, 1.0), torch.zeros(1, 1, 1, 3))


@pytest.mark.parametrize("beta", [0, -2.0, float("inf"), float("nan"), None])
def test_bad_beta_is_refused(beta):
    with pytest.raises(ConfigError, match="beta"):
        scaling_bias(torch.zeros(1, 3, dtype=torch.bool), beta)


def test_window_slice_takes_the_last_keys():
    bias = torch.arange(6.0).reshape(1, 1, 1, 6)
    assert window_slice(bias, 4).flatten().tolist() == [2.0, 3.0, 4.0, 5.0]
    assert window_slice(bias, 6).flatten().tolist() == list(range(6))
    with pytest.raises(ValueError, match="sees 7 keys"):
        window_slice(bias, 7)


def test_aggregate_heads_gathers_rows_onto_the_requested_device():
    rows = [torch.softmax(torch.randn(1, 2, 6), dim=-1), torch.softmax(torch.randn(1, 1, 6), dim=-1)]
    here = aggregate_heads(rows, 6)
    assert here.device == rows[0].device
    # a split model's layers give rows on several devices; "meta" stands in for another one here
    there = aggregate_heads(rows, 6, device="meta")
    assert there.device.type == "meta" and there.shape == here.shape
