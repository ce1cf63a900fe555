"""Experiments: the resumable result store, evaluation over a data set, and the demo."""
