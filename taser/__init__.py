"""taser: dense passage retrieval (DPR, shared encoders, TASER) for open-domain QA."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`from taser import Searcher`: the user-facing objects, imported when first asked for (torch stays unloaded until then)."""
    if name == "Searcher":
        from taser.pipeline.search import Searcher

        return Searcher
    raise AttributeError(f"module 'taser' has no attribute {name!r}")
