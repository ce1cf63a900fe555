"""Experiments: evaluation over a data set into a result store (`dysco_interp.stores`), run on one
process or data-parallel (`dysco_interp.distributed`), its summary table, and the demo."""
