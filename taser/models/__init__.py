"""Bi-encoders (DPR, shared) and TASER's mixture-of-experts specialisation: `biencoder`, `loading`, `settings`, `encoding`."""
