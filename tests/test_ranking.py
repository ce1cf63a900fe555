"""The package's one gold-rank rule: ties count against the gold item."""

import torch

from dysco_interp.ranking import gold_rank, gold_rank_of, in_top_fraction, top_fraction_size


def test_rank_counts_strictly_better_items_plus_one():
    scores = torch.tensor([0.1, 0.5, 0.3, 0.2])
    assert int(gold_rank(scores, 1)) == 1
    assert int(gold_rank(scores, 2)) == 2
    assert int(gold_rank(scores, 0)) == 4


def test_ties_count_against_the_gold_item():
    # a reader that attends to everything equally ranks the gold item last, not first
    assert int(gold_rank(torch.ones(5), 0)) == 5
    assert gold_rank_of([0.2, 0.7, 0.7, 0.1], 2) == 2
    assert gold_rank_of([0.2, 0.7, 0.7, 0.1], 1) == 2


def test_per_row_gold_indices():
    scores = torch.tensor([[0.1, 0.9, 0.0], [0.4, 0.4, 0.2]])
    assert gold_rank(scores, torch.tensor([1, 0])).tolist() == [1, 2]
    assert gold_rank(scores, 2).tolist() == [3, 3]


def test_top_fraction_rounds_up_and_applies_the_tie_rule():
    assert top_fraction_size(20, 0.05) == 1
    assert top_fraction_size(21, 0.05) == 2
    assert top_fraction_size(3, 0.05) == 1
    scores = torch.tensor([[0.5] * 4 + [0.1] * 16])
    # four items tie for first: the gold one ranks 4th, outside the top 5% (one item)
    assert not bool(in_top_fraction(scores, 0, 0.05))
    assert bool(in_top_fraction(scores, 0, 0.25))
