"""Upstream's warnings and info logs kept out of a rank's way (they still reach the rank log)."""

from __future__ import annotations

import logging
import warnings


def quiet() -> None:
    """Keep upstream warnings and info logs out of the way (they still reach the rank log)."""
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
