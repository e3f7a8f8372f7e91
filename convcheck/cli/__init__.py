"""Command line interface (click): `convcheck.cli.main` holds the group and verify; the other commands join it here."""

from convcheck.cli import bisect, gate, selftest, support, sweep, version
from convcheck.cli.main import cli, main

cli.add_command(sweep.sweep)
cli.add_command(sweep.digest)
cli.add_command(selftest.selftest)
cli.add_command(gate.gate)
cli.add_command(version.version)
cli.add_command(bisect.bisect)
cli.add_command(support.support)

__all__ = ["cli", "main"]
