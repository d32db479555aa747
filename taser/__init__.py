"""taser: dense passage retrieval (DPR, shared encoders, TASER) for open-domain QA."""

__version__ = "0.1.0"
