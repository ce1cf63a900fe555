"""`dysco-sparse`: hard DySCO as sparse decoding, one pass per token that reads few keys.

    import dysco_interp.decoding.baselines  # registers it
    generate(model, prompt, DecodingConfig(method="dysco-sparse", params={"window": 512}), heads="shipped")
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

import torch

from dysco_interp.checks import check_bool, check_choice, check_int
from dysco_interp.decoding import relevance, sparse_keys
from dysco_interp.decoding.baselines.dysco_variants import DyscoLagged
from dysco_interp.decoding.methods import SelectionParams, register_method
from dysco_interp.decoding.plan import Bias, Keep, PassPlan

# "after-reads": the layers after the deepest QRHead; "all": every layer (the QRHeads' reads still cover every key)
SparseLayers = Literal["after-reads", "all"]
SPARSE_LAYERS: tuple[SparseLayers, ...] = get_args(SparseLayers)


@register_method
class DyscoSparse(DyscoLagged):
    """dysco-lagged whose layers after the deepest QRHead (or all of them) read only the keys it selects.

    The step is dysco-lagged's (one pass per token; its keys are selected from the QRHeads' read
    in the previous step's biased pass, and get log(beta)), with one change: in the layers after
    the deepest QRHead's layer L*, every head attends only to
    - the blocks of `block` tokens that hold a selected key (whole blocks: a selected key's
      neighbours come with it), at most `max_blocks` of them, those of the highest summed
      relevance where more hold one;
    - each row's first `sinks` tokens (the attention sinks);
    - the last `window` keys: the recent context, the generated tokens and the token's own key;
    and the other keys get -inf (`plan.Keep`; `sparse_keys` computes the kept set). Blocks and
    sinks count from each row's first real token. With `fill_blocks`, the blocks no selected key
    claims go to the blocks of highest relevance outside the sinks and the window: a selection
    of K keys claims at most K blocks, so at a small K most of the `max_blocks` that every step
    pays for would otherwise stay empty. Layers 0..L* stay dense and exact, with the
    bias: the QRHeads must read every key so that the relevance covers the whole context.

    What it trades away: it approximates exact DySCO twice, by the lag (dysco-lagged's: the keys
    come from the previous step's read, which the bias has shaped) and by the mask after L* (a key
    neither selected, near a selected one, a sink nor recent is invisible to the last layers; with
    a window covering the context it is dysco-lagged exactly).

    Why it can beat vanilla decoding at long contexts: a decoding step is bound by the bytes it
    reads, and the KV cache dominates them. Layers 0..L* read the whole cache as vanilla does; the
    L - L* - 1 layers after L* read `capacity = max_blocks * block + sinks + window` keys each
    (the sdpa and static backends gather them, fixed shapes, under CUDA graphs on the static
    one). At 100K keys with the defaults (4,416 keys, 4.4%) the cache read per step falls to
    about (L* + 1) / L of vanilla's (25/36 on Qwen3-8B with the paper's QRHeads), and with it the
    step's time, while DySCO's cost (a partial pass) is gone. The selection and the kept set
    cost a few small kernels over the keys per step (sorts of n_keys and n_keys / block values).
    A run shorter than the capacity (its prompt and new tokens) gathers as many slots as it has
    keys: no more than vanilla's read, and no gain either; at such lengths use dysco-lagged.

    `sparse_layers="all"` keeps keys in every layer, layers 0..L* too: every head's output reads
    the kept keys only, and the QRHeads' rows alone still cover every key (a read in a kept layer
    does, `plan.Keep`), so the selection can reach the whole context. A step then reads, of the
    cache, the kept keys and values in every layer plus the QRHeads' keys (no values) in theirs:
    at 100K on Qwen3-8B with the paper's heads, about 4.4% plus at most 3% of vanilla's cache
    read, rather than 25/36 of it. What it trades away on top: layers 0..L* see the kept keys
    only, too.

    Plan: `PassPlan(reads=(Read(H*),), bias=Bias(every layer), keep=Keep(L*+1..L-1))` given the
    step's bias and kept positions (`Keep(every layer)` with `sparse_layers="all"`); a QRHead in
    the last layer leaves nothing to keep after it: dysco-lagged's plan.
    """

    name = "dysco-sparse"
    description = ("dysco-lagged whose layers after the deepest QRHead (or all of them) read only the selected "
                   "keys' blocks, the sinks and a recent window")

    @dataclasses.dataclass(frozen=True)
    class Params(SelectionParams):
        block: int = 64  # a selected key keeps the whole block of this many tokens it lies in
        sinks: int = 64  # each row's first tokens, always kept
        window: int = 256  # the last keys, always kept (the token's own among them)
        max_blocks: int = 64  # the most blocks kept: with the others, the fixed capacity of a step
        sparse_layers: SparseLayers = "after-reads"  # the layers that read only the kept keys (see the class)
        fill_blocks: bool = False  # the blocks no selected key claims go to the next most relevant ones

        def check(self):
            super().check()
            check_int("block", self.block, 1)
            check_int("sinks", self.sinks, 0)
            check_int("window", self.window, 1)  # the token's own key is always read
            check_int("max_blocks", self.max_blocks, 1)
            check_choice("sparse_layers", self.sparse_layers, SPARSE_LAYERS)
            check_bool("fill_blocks", self.fill_blocks)

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        params = self.params
        assert isinstance(params, DyscoSparse.Params)
        self.block, self.sinks, self.window, self.max_blocks = (params.block, params.sinks, params.window,
                                                                 params.max_blocks)
        self.fill_blocks = params.fill_blocks
        self.capacity = sparse_keys.capacity(self.block, self.sinks, self.window, self.max_blocks)
        kept = range(spec.n_layers) if params.sparse_layers == "all" else range(self.read.max_layer + 1, spec.n_layers)
        if kept:
            self.steering = PassPlan(reads=(self.read,), bias=Bias(range(spec.n_layers)), keep=Keep(kept))
        self.first: torch.Tensor | None = None  # long [B]: each row's first real key
        self.width = self.capacity  # the slots of a step's keep (`start` bounds it by the run's length)

    def start(self, model, batch):
        assert self.never_selected is not None
        self.first = torch.tensor(batch.pads, dtype=torch.long, device=self.never_selected.device)
        # a row never keeps more keys than the run has: the prompt and its new tokens bound the slots
        # of a short run (a fixed width for the run, which the static backend captures once)
        self.width = min(self.capacity, batch.width + int(getattr(self.config, "max_new_tokens", self.capacity)))

    def kept(self, selection: relevance.Selection, n_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's kept keys as `plan.Keep`'s positions and valid slots, `[B, width]`: the
        run's width, or the capacity once a step has more keys than that bound foresaw."""
        assert self.first is not None and self.running.relevance is not None
        keep = sparse_keys.kept_keys(selection.mask, self.running.relevance, self.first, block=self.block,
                                     sinks=self.sinks, window=self.window, max_blocks=self.max_blocks,
                                     fill_blocks=self.fill_blocks)
        return sparse_keys.kept_positions(keep, self.width if n_keys <= self.width else self.capacity)

    def steered(self, selection, n_keys):
        plan = super().steered(selection, n_keys)
        return plan if plan.keep is None else plan.with_keep(*self.kept(selection, n_keys))


__all__ = ["DyscoSparse"]
