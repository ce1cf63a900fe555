"""QR-PASTA: PASTA whose spans the model picks, from the QRHeads' attention at the end of the prompt.

After AutoPASTA (the model chooses what to emphasise, instead of the user): at the method's first
full step (the last prompt tokens the schedule feeds with it; with the default warm-up, the token
before the generation prompt), a pass that stops after the deepest QRHead reads the QRHeads' last
rows, as DySCO's partial pass reads them (`methods.HeadReads`). Their mean row's mass over each
unit of the prompt's last message (its non-blank lines, or its sentences: `unit`) ranks the units;
the `n_spans` heaviest are the emphasised spans, and from that step on the method is PASTA
(`pasta.Pasta`): log(alpha) on every prompt key outside them, in the heads `heads` names, for the
rest of decoding. The choice is made once per prompt and never revised.

Cost: the first full step runs DySCO's two passes (a partial read, then the biased pass); every
step after it one biased pass, as vanilla decoding. The context warm-up reads nothing: the one
read at the end of the prompt decides. The chosen units are in the trace's own values of the
step that chose them (`own["emphasized"]`: their indices in the message, in order).

Two sets of heads: the QRHeads read (the run's H*, as for DySCO) and the steered heads
(`heads`, PASTA's). `unit_masses` and `heaviest_units` are the choice's pure math.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dysco_interp.checks import check_choice, check_number
from dysco_interp.decoding.baselines.pasta import Pasta, PastaParams, outside_values
from dysco_interp.decoding.baselines.spans import UNITS, Unit, message_units, text_rows
from dysco_interp.decoding.methods import HeadReads, checked_heads, register_method
from dysco_interp.errors import ConfigError

if TYPE_CHECKING:
    from dysco_interp.decoding.methods import Run
    from dysco_interp.decoding.params import RunSettings
    from dysco_interp.decoding.prompts import PromptBatch
    from dysco_interp.heads import HeadSet
    from dysco_interp.models import LoadedModel, ModelSpec


def unit_masses(attention: torch.Tensor, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Float32 `[len(spans)]`: the attention row's (`[n_keys]`) mass over each `[start, end)` span."""
    cumulative = torch.nn.functional.pad(attention.float().cpu().cumsum(0), (1, 0))
    starts = torch.tensor([s for s, _ in spans], dtype=torch.long)
    ends = torch.tensor([e for _, e in spans], dtype=torch.long)
    return cumulative[ends] - cumulative[starts]


def heaviest_units(masses: torch.Tensor, n: int) -> list[int]:
    """The indices of the `n` largest masses (all of them if fewer), ascending; of equal masses
    the earlier unit first."""
    order = sorted(range(len(masses)), key=lambda i: (-float(masses[i]), i))
    return sorted(order[:n])


def chosen_keys(spans: Sequence[tuple[int, int]], chosen: Sequence[int], width: int) -> torch.Tensor:
    """Bool `[width]`: the tokens of the chosen spans."""
    keys = torch.zeros(width, dtype=torch.bool)
    for i in chosen:
        start, end = spans[i]
        keys[start:end] = True
    return keys


@register_method
class QrPasta(Pasta):
    name = "qr-pasta"
    description = "PASTA on the n_spans lines or sentences of the last message the QRHeads attend to most at its end"
    uses_heads = True

    @dataclass(frozen=True)
    class Params(PastaParams):
        n_spans: int = 1  # how many units of the last message to emphasise
        unit: Unit = "sentence"  # the last message's units: its non-blank "line"s or its "sentence"s

        def check(self) -> None:
            super().check()
            if isinstance(self.n_spans, bool) or not isinstance(self.n_spans, int):
                raise ConfigError(f"n_spans must be an integer >= 1, got {self.n_spans!r}")
            check_number("n_spans", self.n_spans, at_least=1)
            check_choice("unit", self.unit, UNITS)

    def __init__(self, config: RunSettings, heads: HeadSet | None, spec: ModelSpec):
        super().__init__(config, heads, spec)
        assert heads is not None
        self.reads = HeadReads(heads)
        self.units: list[list[tuple[int, int]]] = []  # each row's units, on the batch's columns
        self.width = 0
        self.valid = torch.zeros(0, 0, dtype=torch.bool)  # bool [B, width]: each row's prompt keys (no pads)
        self.device: torch.device | str = "cpu"
        self.chosen: list[list[int]] | None = None  # each row's emphasised units, once chosen
        self.chose_now = False

    @classmethod
    def heads_for(cls, config: RunSettings, model: LoadedModel, heads: HeadSet | None) -> HeadSet | None:
        return checked_heads(cls.name, model, heads)

    def start(self, model: LoadedModel, batch: PromptBatch) -> None:
        params = self.params
        assert isinstance(params, QrPasta.Params)
        self.width, self.device = batch.width, model.device
        self.valid = torch.zeros(batch.ids.shape, dtype=torch.bool)
        for row, prepared, pad in text_rows(batch, self.name, "splits the prompts' last message"):
            self.valid[row, pad:] = True
            units = message_units(prepared, params.unit, row, self.name)
            self.units.append([(pad + s, pad + e) for s, e in units])

    def choose(self, attention: torch.Tensor) -> None:
        """Each row's units from the QRHeads' mean row (`[B, n_keys]`), and the bias outside them."""
        params = self.params
        assert isinstance(params, QrPasta.Params)
        self.chosen = [heaviest_units(unit_masses(row, units), params.n_spans)
                       for row, units in zip(attention, self.units)]
        emphasized = torch.stack([chosen_keys(units, chosen, self.width)
                                  for units, chosen in zip(self.units, self.chosen)])
        self.values = outside_values(self.valid & ~emphasized, self.alpha).to(self.device)

    def step(self, run: Run, n_keys: int) -> tuple[torch.Tensor, None]:
        self.chose_now = self.chosen is None
        if self.chose_now:
            attention = run(self.reads.partial).attention
            assert attention is not None
            self.choose(attention)
        return super().step(run, n_keys)

    def step_values(self) -> list[dict[str, Any]] | None:
        if not self.chose_now or self.chosen is None:
            return None
        return [{"emphasized": units} for units in self.chosen]


__all__ = ["QrPasta", "chosen_keys", "heaviest_units", "unit_masses"]
