"""Bi-encoders (DPR, shared) and TASER's mixture-of-experts specialisation."""

from taser.models.biencoder import BiEncoder, load_biencoder  # noqa: F401
from taser.models.config import BiEncoderConfig  # noqa: F401
