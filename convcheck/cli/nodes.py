"""The multi-node options `verify`, `gate check` and `selftest` share (one launcher per host, docs/scale.md)."""

from __future__ import annotations

from typing import Any, Callable

import click

from convcheck.engine.nodes import Nodes, make_nodes, reports

NODE_OPTIONS = ("nnodes", "node_rank", "master_addr", "master_port")
"""The parameter names the options below add."""


def node_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """Add --nnodes --node-rank --master-addr --master-port to a command."""
    options = [
        click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Hosts the run spans: start one convcheck per host with the same arguments and its own "
                     "--node-rank; each starts its share of the ranks with torchrun."),
        click.option("--node-rank", type=click.IntRange(min=0), default=None,
                     help="This host's place, 0..nnodes-1 (e.g. $SLURM_NODEID); node 0 prints the report."),
        click.option("--master-addr", default=None,
                     help="Address of node 0, reachable from every node (where the launchers meet)."),
        click.option("--master-port", type=click.IntRange(min=1, max=65535), default=None,
                     help="A free TCP port on node 0 for the launchers' meeting point (torchrun's own "
                     "rendezvous port is picked by node 0 per launch)."),
    ]  # fmt: skip
    for option in reversed(options):
        function = option(function)
    return function


def nodes_of(params: dict[str, Any]) -> Nodes | None:
    """The Nodes of a command's parsed node options (None: one host); BadInput naming the flag."""
    return make_nodes(params["nnodes"], params["node_rank"], params["master_addr"], params["master_port"])


def end_on_other_node(nodes: Nodes | None, verdict: str, code: int) -> None:
    """On a node other than 0, say the verdict in one line and exit with its code (node 0 prints the report)."""
    if reports(nodes):
        return
    click.echo(f"convcheck: node {nodes.node_rank} of {nodes.nnodes}: {verdict} (node 0 prints the report)")
    raise SystemExit(code)
