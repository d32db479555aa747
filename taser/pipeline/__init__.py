"""The stages a researcher chains, callable from Python; `scripts/` are thin Hydra shells over them."""
