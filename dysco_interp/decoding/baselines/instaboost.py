"""InstABoost as a plan program: the attention to the instruction's tokens times M, in every head.

The method (Guardieiro, Stein, Khare and Wong, 2025, "Instruction Following by Boosting Attention
of Large Language Models", arXiv:2506.13734): in every head of every layer, the weight each query
gives to the instruction's tokens is multiplied by a constant M and the row renormalised. Scaling a
softmax weight by M and renormalising is adding log M to that key's score before the softmax (the
paper's later versions state it that way: a constant additive bias on the instruction keys'
logits), so the whole method is one `plan.Bias` over every layer: log M on the instruction's key
positions, 0 on every other key, the same tensor at every step. It reads no heads (no QRHeads,
no partial pass): one pass per token, as vanilla decoding.

How the instruction is found. The original prepends a known instruction string to each task
input and takes as the instruction's tokens those by which the encoded prompt differs from the
encoding of the input alone. The prompts here are not built that way: a task's user message holds
its instruction, its context and its question together, and the instruction is not a prefix of
anything. So the method is told the instruction's text (`Params`):
- `instruction`: the instruction's texts. Every occurrence of each in the rendered prompt is
  boosted, all the tokens that cover its characters (`spans.occurrences`, as PASTA finds its
  `emphasize` spans). Texts that every instance of a task shares (needle QA's two
  instructions, Path Traversal's task description and output format) are given once, on the command
  line too, and hold for every prompt of a batch. A text that a prompt lacks is an error naming
  it, never a silent vanilla run.
- without `instruction`: the content of the prompt's last message, the user turn the model answers
  (the last run of tokens that the chat template did not add). In prompts shaped like the
  original's, an instruction with a short input in one user message, that is the instruction and
  its input, which `context` can take out again.
- `context`: texts never boosted (every occurrence), taken out of either: the input the
  instruction applies to, a long example inside it.
Text search is exact and predictable; the diff of two encodings needs the prompt without its
instruction, which a task's prompt does not have.

Where it applies. The prompt's prefill and its context warm-up tokens run as vanilla's, unbiased,
so that InstABoost shares vanilla's prefill (plans never bias a prefill; only a `Scale` reaches
it). The bias applies from the last prompt tokens that the schedule feeds with the method's full
step (with the default warm-up, the generation prompt and the token before it: DySCO's "reference"
schedule, which every method without a schedule of its own follows) and at every generated
token. Pads get no bias (they are masked anyway); generated tokens are never boosted.

What it does not do that the original does:
- Steer the prompt's own encoding. The original's hook acts in every forward pass, the prefill
  included, so every prompt token after the instruction already attends to it boosted; here only
  the last prompt tokens and the generated ones do, as for every plan method.
- Multiply the post-softmax weights and renormalise them while keeping each row's visible mass.
  With rows that sum to one that is exactly the log M bias; the two differ only in rounding.
- Choose M per task: the original's code picks it on validation data from 1, 3, ..., 19. The
  default here, 5, is one point of that grid; tune it per task as the original does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dysco_interp.checks import brief, check_number
from dysco_interp.decoding.baselines.spans import last_message, text_rows, texts_keys
from dysco_interp.decoding.methods import Method, register_method
from dysco_interp.decoding.params import MethodParams
from dysco_interp.decoding.plan import Bias, PassPlan
from dysco_interp.errors import ConfigError

if TYPE_CHECKING:
    from dysco_interp.decoding.methods import Run
    from dysco_interp.decoding.params import RunSettings
    from dysco_interp.decoding.prompts import PreparedPrompt, PromptBatch
    from dysco_interp.heads import HeadSet
    from dysco_interp.models import LoadedModel, ModelSpec

TEXT_FIELDS = ("instruction", "context")


@register_method
class InstABoost(Method):
    name = "instaboost"
    description = "InstABoost: the attention to the instruction's tokens times M, renormalised, in every head"

    @dataclass(frozen=True)
    class Params(MethodParams):
        M: float = 5.0  # the factor on the attention to the instruction's tokens (1: vanilla decoding)
        # the instruction's texts, every occurrence boosted; none: the content of the prompt's last message
        instruction: tuple[str, ...] = ()
        context: tuple[str, ...] = ()  # texts never boosted, every occurrence (the input the instruction is for)

        def __post_init__(self) -> None:
            for name in TEXT_FIELDS:  # one text may be given as it is, several as a list
                value = getattr(self, name)
                if isinstance(value, (str, list)):
                    object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
            super().__post_init__()

        def check(self) -> None:
            check_number("M", self.M, above=0)
            for name in TEXT_FIELDS:
                for text in getattr(self, name):
                    if not isinstance(text, str) or not text.strip():
                        raise ConfigError(f"{name} holds texts to find in the prompt, and {brief(text)} is none")

    def __init__(self, config: RunSettings, heads: HeadSet | None, spec: ModelSpec):
        super().__init__(config, heads, spec)
        self.boosted = PassPlan(bias=Bias(range(spec.n_layers)))
        self.values: torch.Tensor | None = None  # float32 [B, 1, 1, width]: log M on each row's instruction

    def start(self, model: LoadedModel, batch: PromptBatch) -> None:
        params = self.params
        assert isinstance(params, InstABoost.Params)
        keys = torch.zeros(batch.ids.shape, dtype=torch.bool)
        for row, prepared, pad in text_rows(batch, self.name, "finds the instruction in the prompts' text"):
            keys[row, pad:] = instruction_keys(prepared, params.instruction, params.context, row)
        self.values = torch.where(keys, math.log(params.M), 0.0)[:, None, None, :].to(model.device)

    def step(self, run: Run, n_keys: int) -> tuple[torch.Tensor, None]:
        assert self.values is not None, "start() comes before the first step"
        # the prompt's keys as built, none of the generated ones (a negative pad crops a prompt step's)
        values = torch.nn.functional.pad(self.values, (0, n_keys - self.values.shape[-1]))
        out = run(self.boosted.with_bias(values))
        assert out.logits is not None
        return out.logits, None


def instruction_keys(prepared: PreparedPrompt, instruction: tuple[str, ...], context: tuple[str, ...],
                     row: int = 0) -> torch.Tensor:
    """Bool `[n_prompt]`: the prompt tokens InstABoost boosts (see the module docstring); a
    ConfigError naming prompt `row` of its batch when they cannot be found or are none."""
    if instruction:
        keys = texts_keys(prepared, instruction, "instruction", row, InstABoost.name)
    else:
        keys = last_message(prepared, row, InstABoost.name,
                            "boost: name the instruction's text (the parameter instruction)")
    keys &= ~texts_keys(prepared, context, "context", row, InstABoost.name)
    if not keys.any():
        raise ConfigError(f"instaboost: its context texts leave nothing of the instruction to boost in prompt #{row}")
    return keys
