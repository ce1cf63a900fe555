"""Analyses of decoding runs, each a library module that an `analyses/` script drives.

- measurements on a model: `teacher_forced`, `edge_attention`, `replay`, `first_error`,
  `motivation`, `bench`, `bench_prefill`, `decoding_runs`;
- results read back and summarised: `stores`, `result_tables`, `method_key`, `bootstrap`,
  `table_reports`, `motivation_summary`, `first_error_figures`, `bench_results`, `overhead`,
  `flops`, `route_lines`, `report`;
- `pipeline`: the steps `analyses/run_all.py` runs to regenerate every figure and table.
"""
