"""The field's attention-steering methods and DySCO's open variants as plan programs, each in a
module of its own that registers it under its name when imported (this package imports them all,
and `decoding.config` imports this package, so every config knows them):

- `dysco-lagged`, `dysco-hard`, `dysco-middle`: DySCO in one pass per token selecting from the
  previous step's biased read; DySCO's selection as a hard mask; DySCO biasing the middle layers only;
- `dysco-sparse`: dysco-lagged whose layers after the deepest QRHead (or all of them, the QRHeads'
  reads still covering every key) read only the selected keys' blocks, the sinks and a recent
  window (hard DySCO as sparse decoding);
- `instaboost`: InstABoost (Guardieiro et al., 2025), the attention to an instruction's tokens
  multiplied by M and renormalised in every head;
- `logn`: log-n scaling (Qwen's `use_logn_attn`), every head's logits grown past a training length;
- `pos-calibration`: positional calibration (Found in the Middle, Hsieh et al., 2024), minus the log
  of the attention share a neutral document of the prompt's length gives each position bucket;
- `pasta`: PASTA (Zhang et al., 2024), the attention outside emphasised spans times alpha in chosen heads;
- `qr-pasta`: PASTA on the units of the last message the QRHeads attend to most at the prompt's end.
"""

from dysco_interp.decoding.baselines import (
    dysco_sparse,
    dysco_variants,
    instaboost,
    logn,
    pasta,
    positional,
    qr_pasta,
    spans,
)
from dysco_interp.decoding.choices import BASELINE_NAMES
from dysco_interp.decoding.methods import REGISTRY

# the command line names these before torch is imported (`choices`): the two lists must agree
assert [name for name in REGISTRY if name in BASELINE_NAMES] == list(BASELINE_NAMES)

__all__ = ["dysco_sparse", "dysco_variants", "instaboost", "logn", "pasta", "positional", "qr_pasta", "spans"]
