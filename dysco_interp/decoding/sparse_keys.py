"""Which keys a sparse decoding step reads: pure tensor math, fixed shapes, no host sync.

A selection of keys (DySCO's, on absolute key positions) is rounded up to blocks of `block`
tokens (a block holding one selected key is kept whole), plus each row's first `sinks` tokens
and the last `window` keys, the token's own among them (`kept_keys`); at most `max_blocks`
blocks, those of the highest relevance. With `fill_blocks`, the blocks that no selected key
claims are given to the blocks of highest relevance outside the sinks and the window, so that a
step reads all the keys its capacity pays for. `kept_positions` turns that set into a fixed number of
key positions per row (`plan.Keep`'s positions and valid slots), which a backend gathers.

Blocks and sinks count from each row's first real token, so a row left-padded in a batch keeps
the keys it keeps alone. Nothing here reads a tensor's values on the host: every result is a
device tensor of a shape the arguments fix, so a decoding step can run ahead of the device and
the static backend's captured passes replay.
"""

from __future__ import annotations

import torch


def capacity(block: int, sinks: int, window: int, max_blocks: int) -> int:
    """The most keys `kept_keys` keeps in a row: every kept block, the sinks and the window."""
    return max_blocks * block + sinks + window


def kept_keys(selected: torch.Tensor, relevance: torch.Tensor, first: torch.Tensor, *, block: int, sinks: int,
              window: int, max_blocks: int, fill_blocks: bool = False) -> torch.Tensor:
    """bool `[B, n_keys]`: the keys a sparse step reads.

    Args:
        selected: bool `[B, n_keys]`, the selected keys (absolute positions, the own key last).
        relevance: float `[B, n_keys]`, what ranks the blocks when more than `max_blocks` hold a
            selected key: a block's summed relevance, the earlier block first among equal ones.
        first: long `[B]`, each row's first real key (its left pads before it, never kept).
        block: the tokens of a key block (see the module docstring).
        sinks: the first tokens of each row, always kept.
        window: the last keys, always kept (the own key among them).
        max_blocks: the most blocks kept; beyond it, those of highest summed relevance.
        fill_blocks: keep `max_blocks` blocks even when fewer hold a selected key: after those,
            the blocks of highest summed relevance over their keys outside the sinks and the
            window (those keys are read anyway), the earlier block first among equal ones.
    """
    batch, n_keys = selected.shape
    device = selected.device
    column = torch.arange(n_keys, device=device)[None, :]
    position = column - first.to(device)[:, None]  # from the row's first real token; negative at pads
    real = position >= 0
    n_blocks = -(-n_keys // block)
    spare = n_blocks  # the pads' block, dropped
    block_of = torch.where(real, position.div(block, rounding_mode="floor"), spare)
    always = real & ((position < sinks) | (column >= n_keys - window))
    holds = torch.zeros(batch, n_blocks + 1, device=device).scatter_add_(1, block_of, (selected & real).float())
    weight = relevance.float() * real
    score = torch.zeros(batch, n_blocks + 1, device=device).scatter_add_(1, block_of, weight)
    holds, score = holds[:, :n_blocks] > 0, score[:, :n_blocks]
    first_ones = torch.arange(n_blocks, device=device)[None, :] < max_blocks
    if fill_blocks:  # a block no selected key claims ranks by what it adds to the sinks and the window
        adds = torch.zeros(batch, n_blocks + 1, device=device).scatter_add_(1, block_of, weight * ~always)
        # the holding blocks first, each group by its relevance, the earlier first among equals: two stable sorts
        order = torch.sort(torch.where(holds, score, adds[:, :n_blocks]), dim=-1, descending=True, stable=True).indices
        order = order.gather(1, torch.sort(holds.gather(1, order).float(), dim=-1, descending=True,
                                           stable=True).indices)
        take = first_ones.expand_as(holds)
    else:  # relevance is >= 0, so -1 ranks the blocks that hold no selected key last
        order = torch.sort(torch.where(holds, score, -1.0), dim=-1, descending=True, stable=True).indices
        take = holds.gather(1, order) & first_ones
    chosen = torch.zeros_like(holds).scatter_(1, order, take)
    in_chosen = chosen.gather(1, block_of.clamp(max=n_blocks - 1)) & real
    return in_chosen | always


def kept_positions(keep: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept keys of each row (bool `[B, n_keys]`) as `width` slots: long positions, ascending,
    and bool valid slots, both `[B, width]`; the slots after a row's last kept key are invalid (at
    position 0). A row keeping more than `width` keys loses its last ones: `width` is at least
    `capacity(...)` for what `kept_keys` keeps."""
    batch, n_keys = keep.shape
    rank = keep.long().cumsum(dim=-1) - 1
    slot = torch.where(keep & (rank < width), rank, width)  # the others land in a spare slot, dropped
    columns = torch.arange(n_keys, device=keep.device).expand(batch, n_keys)
    positions = torch.zeros(batch, width + 1, dtype=torch.long, device=keep.device).scatter_(1, slot, columns)
    valid = torch.zeros(batch, width + 1, dtype=torch.bool, device=keep.device).scatter_(1, slot, keep)
    return positions[:, :width] * valid[:, :width], valid[:, :width]
