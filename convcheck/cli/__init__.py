"""Command line interface (click)."""

from convcheck.cli.main import cli, main

__all__ = ["cli", "main"]
