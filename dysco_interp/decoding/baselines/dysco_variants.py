"""Three variants of DySCO that the paper leaves open, each a `Dysco` that changes one piece of its step.

- `dysco-lagged`: one forward pass per token; a step's keys come from the QRHeads' read of the
  step before, made in that step's biased pass.
- `dysco-hard`: hard selection; every key but the selected ones (and those DySCO never drops) is
  masked out, instead of log(beta) on the selected ones.
- `dysco-middle`: DySCO's bias in the middle layers only.

Each is a program of `plan.PassPlan`s, so every backend runs it (bridge, sdpa, static), in padded
batches, and the static backend captures its plans once. Importing this module registers them:

    import dysco_interp.decoding.baselines.dysco_variants  # noqa: F401
    generate(model, prompt, DecodingConfig(method="dysco-lagged"), heads="shipped")

Their parameters are DySCO's (`SelectionParams`), with dysco-hard's `keep_generated` and
dysco-middle's `depth_from`, `depth_to` beside them.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from dysco_interp.checks import check_number
from dysco_interp.decoding import relevance
from dysco_interp.decoding.methods import Dysco, SelectionParams, register_method
from dysco_interp.decoding.plan import Bias, Mask, PassPlan
from dysco_interp.decoding.template import extend_mask
from dysco_interp.errors import ConfigError


@dataclasses.dataclass
class Ahead:
    """A step's selection and plan, made before the step for `n_keys` keys from the relevance
    `source`, and that relevance `padded` to them."""

    n_keys: int
    source: torch.Tensor | None
    padded: torch.Tensor | None
    selection: relevance.Selection
    plan: PassPlan


@register_method
class DyscoLagged(Dysco):
    """DySCO in one forward pass per token, its selection one step behind.

    DySCO reads the QRHeads in a partial pass (no bias, nothing cached) before each biased pass.
    Here the biased pass reads them itself, and that read (which sees the bias: the QRHeads'
    rows are softmaxes of the biased scores) moves the running relevance that the NEXT step
    selects from. So step t's keys are chosen from the relevance after step t-1's read:
    - the first full step (the first intervention warm-up token) selects from the context
      warm-up's reads, the relevance the selector holds after warm-up; with no context warm-up
      (a short prompt or a small `warmup`) there is none, and that one step reads the QRHeads in
      DySCO's partial pass first;
    - the current token's own key, which no read has seen yet, has relevance 0 when the step
      selects; it is boosted anyway, as in DySCO.

    Cost: one full pass per token. DySCO runs 1 + (L* + 1) / L passes' worth of layers, L* the
    deepest QRHead's layer of L: about 1.6-1.7 on the paper's models (its partial pass runs 25
    of Qwen3-8B's 36 layers, 20 of Llama-3.1-8B's 32). The price: the selection lags one token
    behind, and it comes from a read the bias has already shaped (a boosted key tends to draw
    more of the QRHeads' attention, and so to be selected again).

    Plan: `PassPlan(reads=(Read(H*),), bias=Bias(every layer))` given this step's tensor bias;
    the read returns the mean of H*'s rows as the pass computed them. With beta = 1 the bias is
    0 and the tokens are vanilla's.
    """

    name = "dysco-lagged"
    description = "DySCO in one pass per token: the keys come from the QRHeads' read in the previous step's biased pass"

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        self.steering = PassPlan(reads=(self.read,), bias=Bias(range(spec.n_layers)))
        self.ahead: Ahead | None = None  # the next step's selection and plan, made at the end of this one

    def step(self, run, n_keys):
        selector = self.running
        if selector.relevance is None:  # no context warm-up: this one step reads before it biases
            attention = run(self.partial).attention
            assert attention is not None
            selector.update(attention)
        selection, plan = self.planned(n_keys)
        out = run(plan)
        assert out.attention is not None and out.logits is not None
        selector.update(out.attention)  # what the next step selects from
        # The next step's selection is made now, not when it starts: its kernels are queued behind
        # this step's pass, which the device is still running, instead of being launched one by
        # one while the device waits for them at the next step's start.
        source = selector.relevance
        selection_ahead, plan_ahead = self.prepared(n_keys + 1)
        self.ahead = Ahead(n_keys + 1, source, selector.relevance, selection_ahead, plan_ahead)
        selector.relevance = source  # between steps it covers the keys the reads saw, as DySCO's
        return out.logits, selection

    def planned(self, n_keys: int) -> tuple[relevance.Selection, PassPlan]:
        """The step's selection and plan: those the last step made ahead, if they were made for
        this many keys from the relevance as it stands (nothing has replaced it since), else made now."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead.n_keys == n_keys and ahead.source is self.running.relevance:
            self.running.relevance = ahead.padded
            return ahead.selection, ahead.plan
        return self.prepared(n_keys)

    def prepared(self, n_keys: int) -> tuple[relevance.Selection, PassPlan]:
        """The selection and plan of a step over `n_keys` keys, from the running relevance
        (padded to them in place: 0 for the keys no read has seen)."""
        selector = self.running
        assert selector.relevance is not None
        # the keys the last read saw, and 0 for this token's own: the padding `update` gives it too
        selector.relevance = torch.nn.functional.pad(selector.relevance, (0, n_keys - selector.relevance.shape[-1]))
        selection = selector.select(n_keys)
        return selection, self.steered(selection, n_keys)

    def steered(self, selection: relevance.Selection, n_keys: int) -> PassPlan:
        """The step's one pass, given its selection: the bias on the selected keys."""
        return self.steering.with_bias(self.running.bias(selection.mask))


@register_method
class DyscoHard(Dysco):
    """DySCO with hard selection: a mask instead of a boost.

    DySCO's partial pass and selection, then the full pass in which every head of every layer
    sees only these keys of its row (the others get -inf on their scores, `plan.Mask`):
    - the selected keys (nucleus-then-K over the running relevance, as in DySCO);
    - the current token's own key, always;
    - the chat-template tokens that `template_masking` names: DySCO leaves them as the model has
      them (never selected, so never boosted), and so does this: never selected, never hidden.
      With `template_masking="off"` there are none, and template tokens are selectable like any
      other key: the official code's hard mode ("strength >= 99": -inf on every key but the
      selected ones and the current token's, template masking not applied);
    - with `keep_generated`, every generated token's key (its position from the prompt's end on);
      without it (the default, as the official code), a generated token stays visible only
      while it is selected.
    Everything else is hidden: context tokens not selected, and generated ones unless kept. Pads
    stay hidden. The trace's selection is the selected keys (not the always-visible ones).

    `beta` is unused: a mask has no strength. It stays a parameter (these are DySCO's
    `SelectionParams`) so that presets and sweeps that name it run this method too; its value
    changes nothing. With `select_p=1` and a `select_k` of at least the sequence's length every
    key stays visible and the tokens are vanilla's.

    Cost: DySCO's (a partial pass up to the deepest QRHead's layer, then a full pass).
    Plan: `PassPlan(mask=Mask(every layer))` given this step's keys, bool `[B, 1, 1, n_keys]`.
    """

    name = "dysco-hard"
    description = "DySCO with hard selection: -inf on every key but the selected ones, the own key and the template"

    @dataclasses.dataclass(frozen=True)
    class Params(SelectionParams):
        keep_generated: bool = False  # every generated token stays visible too, selected or not

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        self.masked = PassPlan(mask=Mask(range(spec.n_layers)))
        self.visible: torch.Tensor | None = None  # bool [B, capacity]: the keys no step hides

    def start(self, model, batch):
        assert self.never_selected is not None
        params = self.params
        assert isinstance(params, DyscoHard.Params)
        capacity = self.never_selected.shape[-1]
        visible = extend_mask(batch.templates[params.template_masking], capacity)  # False at pads
        if params.keep_generated:
            visible[:, batch.width:] = True
        self.visible = visible.to(self.never_selected.device)

    def step(self, run, n_keys):
        assert self.visible is not None
        selection = self.select(run, n_keys)
        keep = selection.mask | self.visible[:, :n_keys]
        keep[:, -1] = True  # the current token's own key
        out = run(self.masked.with_mask(keep[:, None, None, :]))
        assert out.logits is not None
        return out.logits, selection


def middle_layers(n_layers: int, depth_from: float, depth_to: float) -> range:
    """Layers floor(depth_from * n_layers) .. ceil(depth_to * n_layers) - 1: never empty for
    0 <= depth_from < depth_to <= 1; (0, 1) is every layer."""
    # rounded first: 0.3 * 10 is 3.0000000000000004, whose ceiling would take one layer too many
    return range(math.floor(round(depth_from * n_layers, 9)), math.ceil(round(depth_to * n_layers, 9)))


@register_method
class DyscoMiddle(Dysco):
    """DySCO with its bias in the middle layers only.

    DySCO's QRHeads, partial pass and selection; the full pass adds log(beta) to the selected
    keys' scores (and the current token's own key's) in every head of layers
    `middle_layers(L, depth_from, depth_to)` of an L-layer model, i.e. floor(depth_from * L)
    .. ceil(depth_to * L) - 1, and nothing in the other layers. The default, the middle half of
    the depth (0.25, 0.75), leaves the first and the last quarter unbiased; it is this package's
    choice, not a range the paper states. `depth_from=0, depth_to=1` is DySCO.

    Cost: DySCO's (a partial pass up to the deepest QRHead's layer, then a full pass).
    Plan: DySCO's, with `Bias(middle_layers(...))` for `Bias(range(L))`.
    """

    name = "dysco-middle"
    description = "DySCO with its bias only in the middle layers (depth_from..depth_to of the depth)"

    @dataclasses.dataclass(frozen=True)
    class Params(SelectionParams):
        depth_from: float = 0.25  # the first biased layer, as a fraction of the depth
        depth_to: float = 0.75  # the end of the biased layers, as a fraction of the depth

        def check(self):
            super().check()
            check_number("depth_from", self.depth_from, at_least=0, below=1)
            check_number("depth_to", self.depth_to, above=0, at_most=1)
            if not self.depth_from < self.depth_to:
                raise ConfigError(f"depth_from ({self.depth_from}) must be below depth_to ({self.depth_to}): the "
                                  "biased layers are the fractions of the depth between them")

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        params = self.params
        assert isinstance(params, DyscoMiddle.Params)
        self.layers = middle_layers(spec.n_layers, params.depth_from, params.depth_to)
        self.biased = PassPlan(bias=Bias(self.layers))


__all__ = ["DyscoHard", "DyscoLagged", "DyscoMiddle", "middle_layers"]
