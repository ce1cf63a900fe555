"""DySCO and its baselines as one decode loop.

- `config` (DecodingConfig, presets) and `methods` (one strategy per method, chosen once);
- `relevance` (the pure tensor math: aggregate, momentum, nucleus-then-K selection, bias);
- `loop` (the `Stepper` and the schedule: `generate`, `generate_batch`, `compare_methods`);
- `backends/` (where a pass runs: the TransformerLens bridge, SDPA, static buffers with CUDA graphs);
- `interventions` (DySCO as TransformerLens hooks), `runtime` (prefill and cached steps on the bridge);
- `passes` (`current_pass()`: which forward pass a user hook runs in), `arguments` (the forms
  users write: heads, options, hooks, forced answers);
- `prompts`, `template`, `sampling`, `span_mass`, `results` (what a run gives back).
"""

from dysco_interp.decoding.passes import Pass, current_pass

__all__ = ["Pass", "current_pass"]
