"""Log-n attention scaling as a plan program: every head's logits grown past a training length.

The method (Qwen's `use_logn_attn`, in the first Qwen models' modelling code, one of the pieces
of their context-length extension): the pre-softmax scores of a query that sees n keys are
multiplied by max(1, ln n / ln n_train), n_train being the context length the model was trained
on. Inside the training length nothing changes; past it the logits grow with the log of the
length, which keeps the attention's entropy from growing with the number of keys it spreads over.
n is the query's position + 1 (the keys it sees, its own included), counted in each row's own
tokens, pads excluded, so a padded batch gives each row the tokens it gets alone.

How it maps onto a plan: one `plan.Scale(every layer, log_n=train_length)`. It changes the
prompt too: the prefill takes the same scale (`prefill_scale`, as UniAttnS's temperature does), so
`config.changes_prefill` is true and the method never shares vanilla's prefill, whatever the
prompt's length (the prefill is planned before the length is known). Every later pass, the
context warm-up tokens and each decoding step, is the same plain pass with that scale. It reads no
heads and adds no bias.

`train_length` defaults to 32768, the native context of Qwen2.5 (its `max_position_embeddings`).
Qwen2 and Qwen2.5 checkpoints do not apply log-n scaling themselves, so on them this is an
inference-time intervention beside the model's own attention; the first Qwen models apply it
at inference with their config's `seq_length` as the training length. Prompts shorter than
`train_length` decode as vanilla does: give a shorter one to see it act.

What it does not do that Qwen's code does: Qwen pairs log-n scaling with dynamic NTK-aware
rotary scaling (`use_dynamic_ntk`) for long inputs; this method is the log-n part alone and
leaves the position encodings as the model has them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dysco_interp.checks import check_int
from dysco_interp.decoding.methods import Method, register_method
from dysco_interp.decoding.params import MethodParams
from dysco_interp.decoding.plan import PassPlan, Scale

if TYPE_CHECKING:
    from dysco_interp.decoding.params import RunSettings
    from dysco_interp.heads import HeadSet
    from dysco_interp.models import ModelSpec

QWEN25_TRAIN_LENGTH = 32768


@register_method
class LogN(Method):
    name = "logn"
    description = "log-n scaling: every head's logits times max(1, ln n / ln train_length), prefill included"

    @dataclass(frozen=True)
    class Params(MethodParams):
        train_length: int = QWEN25_TRAIN_LENGTH  # keys past which the logits grow (Qwen2.5's native context)

        def check(self) -> None:
            check_int("train_length", self.train_length, minimum=2)

    def __init__(self, config: RunSettings, heads: HeadSet | None, spec: ModelSpec):
        super().__init__(config, heads, spec)
        self.plain = PassPlan(scale=self.prefill_scale(config, spec.n_layers))

    @classmethod
    def prefill_scale(cls, config: RunSettings, n_layers: int) -> Scale:
        return Scale(range(n_layers), log_n=config.parameter("train_length"))
