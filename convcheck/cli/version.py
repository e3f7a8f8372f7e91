"""`convcheck version write|check`."""

import click


@click.group()
def version() -> None:
    """Version folders."""
