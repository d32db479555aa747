"""Retrieval: passage encoding, FAISS indexes, BM25, hybrid fusion and negative mining."""
