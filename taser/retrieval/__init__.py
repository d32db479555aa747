"""Retrieval: passage encoding, FAISS indexes, BM25, hybrid fusion and negative mining."""

from taser.retrieval.faiss_loader import quiet_faiss_loader

quiet_faiss_loader()  # before any module here imports faiss: one line instead of its loader's messages
