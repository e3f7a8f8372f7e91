"""The small exception hierarchy of convcheck."""

from __future__ import annotations


class ConvcheckError(Exception):
    """Base of every error convcheck raises on purpose."""


class BadInput(ConvcheckError):
    """The user's input (checkpoint, model name, layout, option) cannot be used; exit code 2."""


class SetupError(ConvcheckError):
    """The environment or a rank failed before any verdict could be reached; exit code 2."""
