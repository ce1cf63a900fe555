"""DySCO and its baselines as one decode loop.

- `config` (DecodingConfig, presets) and `methods` (each method a program of pass plans, in a
  registry that a user's own methods join), `steering` (a steering method in a few lines);
- `plan` (the pass plan every backend runs: reads, bias, mask, logit scale; a `Read` asks for
  attention rows, a `ReadOut` is what a pass gives back), `readout` (the math that makes a
  `ReadOut`) and `logit_scale` (a plan's scale as SDPA-style attention applies it);
- `relevance` (the pure tensor math: aggregate, momentum, nucleus-then-K selection, bias);
- `stepper` (one method fed token by token) and `loop` (the schedule: `generate_batch`, with
  `compare_methods` and `generate` over it);
- `backends/` (where a plan runs: the TransformerLens bridge and its hooks, SDPA, static buffers
  with CUDA graphs; each backend with its own options), `runtime` (prefill and cached steps on the bridge);
- `observe` (hooks, a `read=` and its `on_read` callback scoped by a context for every decoding
  call inside it);
- `passes` (`current_pass()`: which forward pass a user hook runs in), `arguments` (the forms
  users write: heads, options, hooks, forced answers, and the retired keywords);
- `prompts`, `template`, `sampling`, `span_mass`, `results` (what a run gives back).
"""

from dysco_interp.decoding.passes import Pass, current_pass

__all__ = ["Pass", "current_pass"]
