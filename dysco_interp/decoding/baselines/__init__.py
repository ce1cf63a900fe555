"""The field's attention-steering methods as plan programs: published methods beside DySCO,
each in a module of its own that registers it under its name when imported.

- `instaboost`: InstABoost (Guardieiro et al., 2025), the attention to an instruction's tokens
  multiplied by M and renormalised in every head;
- `logn`: log-n scaling (Qwen's `use_logn_attn`), every head's logits grown past a training length.
"""
