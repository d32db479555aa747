"""Losses, batching, distributed helpers and the trainer (checkpoint + resume)."""
