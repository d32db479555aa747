"""Hydra's plugins live in the `hydra_plugins` namespace: the table sweeper of `scripts/experiment.py`."""
