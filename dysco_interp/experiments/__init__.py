"""Experiments: evaluation over a data set into a result store (`dysco_interp.stores`), its data-parallel
runs, its summary table, and the demo."""
