"""PASTA as a plan program: in chosen heads, log(alpha) on every prompt key outside the emphasised spans.

The method (Zhang et al., 2024, "Tell Your Model Where to Attend: Post-hoc Attention Steering for
LLMs", ICLR; the `pastalib` package): in a chosen set of attention heads, the weight each query
gives to every prompt token outside the spans the user emphasises is multiplied by a coefficient
alpha < 1 and the row renormalised ("exclude" scaling, the original's default). Scaling a softmax
weight by alpha and renormalising is adding log(alpha) to that key's score before the softmax, so
the method is one `plan.Bias` on the chosen heads only: log(alpha) on the prompt keys outside the
spans, 0 on the spans, the same tensor at every step. It reads no heads: one pass per token, as
vanilla decoding. The heads are the method's own parameter (`heads`, TransformerLens labels such
as "L10H0 L12H3"), chosen per model and task: the original profiles every head alone on dev data
and keeps the best; `pasta_profile.profile_heads` does that here, and `top_heads` writes the
chosen ones as this parameter.

The spans (`emphasize`): texts found in the rendered prompt, every occurrence of each, all the
tokens that cover its characters (`spans.occurrences`, as InstABoost finds its instruction). Without
them, the content of the prompt's last message, the user turn the model answers (as InstABoost
takes it). A text that a prompt lacks is an error naming it, never a silent vanilla run.

Where it applies. The prompt's prefill and its context warm-up tokens run as vanilla's, unbiased:
plans never bias a prefill, so PASTA shares vanilla's. The bias applies from the last prompt tokens
that the schedule feeds with the method's full step (with the default warm-up, the generation
prompt and the token before it) and at every generated token. Generated tokens' keys are never
scaled (the original's mask stops at the prompt's length too); pads get no bias (they are masked).

What it does not do that the original does:
- Steer the prompt's own encoding. The original edits the attention mask in every forward pass,
  the prefill included, so every prompt token already attends to the spans steered; here only
  the last prompt tokens and the generated ones do, as for every plan method.
- Count a key once per span it lies outside. With several spans the original scales by alpha
  for each span a key is outside of (alpha^2 outside two spans, alpha inside one of them); here a
  key outside every span gets log(alpha) once, and a key inside any span none.
- Find only the first occurrence of a span's text: the original takes one occurrence (the first
  by default); here every occurrence is emphasised.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dysco_interp.checks import brief, check_number
from dysco_interp.decoding.baselines.spans import last_message, text_rows, texts_keys
from dysco_interp.decoding.methods import Method, register_method
from dysco_interp.decoding.params import MethodParams
from dysco_interp.decoding.plan import Bias, PassPlan
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import head_label

if TYPE_CHECKING:
    from dysco_interp.decoding.methods import Run
    from dysco_interp.decoding.params import RunSettings
    from dysco_interp.decoding.prompts import PreparedPrompt, PromptBatch
    from dysco_interp.heads import HeadSet
    from dysco_interp.models import LoadedModel, ModelSpec

HEADS_EXAMPLE = '"L10H0 L12H3"'
HEAD_LABEL = re.compile(r"L(\d+)H(\d+)")


def parse_heads(text: str) -> tuple[tuple[int, int], ...]:
    """TransformerLens head labels separated by spaces or commas ("L10H0 L12H3") as sorted,
    distinct (layer, head) pairs; a ConfigError for anything else (none is an empty tuple)."""
    if not isinstance(text, str):
        raise ConfigError(f"heads are TransformerLens labels in one string, e.g. {HEADS_EXAMPLE}, not {brief(text)}")
    pairs = set()
    for label in re.split(r"[\s,]+", text):
        if label:
            found = HEAD_LABEL.fullmatch(label)
            if found is None:
                raise ConfigError(f"heads: {brief(label)} is not a TransformerLens head label (write them as "
                                  f"{HEADS_EXAMPLE})")
            pairs.add((int(found.group(1)), int(found.group(2))))
    return tuple(sorted(pairs))


def model_heads(text: str, spec: ModelSpec, method: str) -> tuple[tuple[int, int], ...]:
    """`parse_heads` checked against the model: every head inside it, at least one."""
    pairs = parse_heads(text)
    if not pairs:
        raise ConfigError(f"method {method!r} steers the heads its parameter heads names, and it names none: "
                          f"give them, e.g. {HEADS_EXAMPLE} (pasta_profile.profile_heads ranks a model's heads)")
    outside = [head_label(*p) for p in pairs if not (p[0] < spec.n_layers and p[1] < spec.n_heads)]
    if outside:
        raise ConfigError(f"method {method!r}: head {outside[0]} is outside the model ({spec.n_layers} layers x "
                          f"{spec.n_heads} heads)")
    return pairs


def outside_values(outside: torch.Tensor, alpha: float) -> torch.Tensor:
    """Float32 `[B, 1, 1, width]`: log(alpha) on the keys `outside` (bool `[B, width]`), 0 elsewhere."""
    return torch.where(outside, math.log(alpha), 0.0)[:, None, None, :]


@dataclass(frozen=True)
class PastaParams(MethodParams):
    """The parameters of PASTA's bias, which `pasta` and `qr-pasta` share."""

    alpha: float = 0.01  # the weight left to each key outside the spans, in (0, 1] (1: vanilla decoding)
    # the steered heads as TransformerLens labels, e.g. "L10H0 L12H3"; a run needs at least one
    heads: str = ""

    def check(self) -> None:
        check_number("alpha", self.alpha, above=0, at_most=1)
        parse_heads(self.heads)


@register_method
class Pasta(Method):
    name = "pasta"
    description = "PASTA: the attention to every prompt key outside the emphasised spans times alpha, in chosen heads"

    @dataclass(frozen=True)
    class Params(PastaParams):
        # the emphasised texts, every occurrence; none: the content of the prompt's last message
        emphasize: tuple[str, ...] = ()

        def __post_init__(self) -> None:
            if isinstance(self.emphasize, (str, list)):  # one text may be given as it is, several as a list
                value = self.emphasize
                object.__setattr__(self, "emphasize", (value,) if isinstance(value, str) else tuple(value))
            super().__post_init__()

        def check(self) -> None:
            super().check()
            for text in self.emphasize:
                if not isinstance(text, str) or not text.strip():
                    raise ConfigError(f"emphasize holds texts to find in the prompt, and {brief(text)} is none")

    def __init__(self, config: RunSettings, heads: HeadSet | None, spec: ModelSpec):
        super().__init__(config, heads, spec)
        params = self.params
        assert isinstance(params, PastaParams)
        self.alpha = params.alpha
        self.steered_heads = model_heads(params.heads, spec, self.name)
        layers = {layer for layer, _ in self.steered_heads}
        self.steered = PassPlan(bias=Bias(layers, self.steered_heads)).check(spec.n_layers, spec.n_heads)
        self.values: torch.Tensor | None = None  # float32 [B, 1, 1, width]: log(alpha) outside each row's spans

    def start(self, model: LoadedModel, batch: PromptBatch) -> None:
        params = self.params
        assert isinstance(params, Pasta.Params)
        outside = torch.zeros(batch.ids.shape, dtype=torch.bool)
        for row, prepared, pad in text_rows(batch, self.name, "finds the emphasised spans in the prompts' text"):
            outside[row, pad:] = ~emphasized_keys(prepared, params.emphasize, row)
        self.values = outside_values(outside, self.alpha).to(model.device)

    def step(self, run: Run, n_keys: int) -> tuple[torch.Tensor, None]:
        assert self.values is not None, "start() comes before the first step"
        # the prompt's keys as built, none of the generated ones (a negative pad crops a prompt step's)
        values = torch.nn.functional.pad(self.values, (0, n_keys - self.values.shape[-1]))
        out = run(self.steered.with_bias(values))
        assert out.logits is not None
        return out.logits, None


def emphasized_keys(prepared: PreparedPrompt, emphasize: tuple[str, ...], row: int = 0) -> torch.Tensor:
    """Bool `[n_prompt]`: the prompt tokens PASTA emphasises (see the module docstring); a
    ConfigError naming prompt `row` of its batch when they cannot be found."""
    if emphasize:
        return texts_keys(prepared, emphasize, "emphasize", row, Pasta.name)
    return last_message(prepared, row, Pasta.name, "emphasise: name the texts to emphasise (the parameter emphasize)")


__all__ = ["Pasta", "PastaParams", "emphasized_keys", "model_heads", "outside_values", "parse_heads"]
