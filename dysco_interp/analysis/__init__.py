"""The analysis library: tools a researcher calls on their own runs, models and result stores.

The rule: a module belongs here when it takes what it works on (a model, an instance, records,
a store, benchmark documents) as arguments and fixes no design of its own: no grid of
parameters, no head sets, splits or lengths, no folder of committed results. What fixes such a
design to answer one question of the paper is a study (`dysco_interp.studies`), built from these
pieces. Nothing here imports a study.

- measurements on a model: `teacher_forced`, `edge_attention`, `replay`, `decode_exactness`,
  and the benchmarks' timing machinery `bench`, `bench_peer`, `bench_prefill`, `bench_threads`,
  `bench_data_parallel`;
- reading a run: `route_lines` (a route line by line, where it first goes wrong),
  `step_mechanism` (an instance step by step, from a replay);
- results read back and summarised: `records` (evaluation records read from stores, checked and pooled),
  `method_key`, `result_tables`, `bootstrap`, `bench_results`, `flops`, the exact statistics of
  a paired comparison `paired` (counts and a sign-flip p), `multiplicity` (Benjamini-Hochberg q
  over a table) and `equivalence` (TOST at a stated margin),
  `logistic` (a logistic model with instance-resampled odds ratios), `step_signals` and
  `step_controls` (fix and break rates by signal, and controlled for a step's difficulty);
- `report`: the Markdown and JSON outputs of tables with intervals.
"""
