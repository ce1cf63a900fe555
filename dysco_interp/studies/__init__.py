"""The paper's studies, and this project's own: each a design fixed in advance to answer one question.

The rule: a module belongs here when it fixes a study's design (its grids of parameters, head
sets, splits and lengths), the stores it writes and where, the summaries, tables and figures drawn
from those stores, or the command-line flags its `analyses/` script shares; what it measures and
summarises with comes from the library, `dysco_interp.analysis`. Nothing else in the package
imports a study (tests/test_architecture.py checks): the `analyses/` scripts and the tests drive
them.

- the decoding runs behind the Path Traversal, ablation and robustness tables: `decoding_runs`
  (the runs), `table_reports` (each table's document and page);
- the selection budget: `budget_study` (the sweep and the held-out runs), `budget_choice` (the
  rule that chooses a configuration on the dev split), `budget_report` (curves and tables);
- the causal head ablation: `head_ablation` (the ablated passes), `ablation_summary` (drops
  against no ablation, the figure);
- the motivation (the paper's Figure 3): `motivation` (the teacher-forced passes),
  `motivation_summary` (per-length summary, the figure);
- the first error on Path Traversal: `first_error` (attention where vanilla first goes wrong),
  `first_error_figures`;
- DySCO's overhead: `overhead` (FLOPs estimate beside measured speed and memory);
- `study_arguments`: the flags the head studies' scripts share;
- `pipeline`: the plan of `analyses/run_all.py`, which regenerates every committed table and figure.
"""
