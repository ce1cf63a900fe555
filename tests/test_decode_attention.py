"""The decoding attention's pieces: a long row's softmax."""

import math

import pytest
import torch

from dysco_interp.decoding.backends.decode_attention import LONG_ROW, reduced_softmax, row_softmax


def rows(n: int, device: str = "cpu") -> torch.Tensor:
    scores = torch.randn(2, 3, n, generator=torch.Generator().manual_seed(n)) * 8
    scores[:, :, -7:] = -math.inf  # empty slots and pads
    scores[0, 1, 5] = 60.0  # one key far above the rest
    return scores.to(device)


@pytest.mark.parametrize("n", [1000, 4096, 102400])  # one block; two of 2048; fifty
def test_the_reduced_softmax_is_the_softmax(n):
    scores = rows(n)
    ours = reduced_softmax(scores.clone())
    torch.testing.assert_close(ours, scores.softmax(-1), atol=1e-7, rtol=1e-5)  # float32 sums in another order
    assert torch.equal(ours[:, :, -7:], torch.zeros(2, 3, 7))
    assert ours.shape == scores.shape
    assert torch.equal(row_softmax(scores), scores.softmax(-1))  # off a GPU: PyTorch's own


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_long_row_on_a_gpu_is_split_and_still_the_softmax():
    for n in (LONG_ROW - 256, LONG_ROW, 102400):
        scores = rows(n, "cuda")
        torch.testing.assert_close(row_softmax(scores), scores.softmax(-1), atol=1e-7, rtol=1e-5)
