"""Several hosts, one run: which node this launcher is and where the nodes meet (plain data, no torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from convcheck.errors import BadInput

ONE_NODE_ONLY = ("distckpt", "save")
"""Oracles whose ranks write one folder every rank reads back: not across hosts without a shared filesystem."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Nodes:
    """This launcher's place among `nnodes` launchers, one per host, meeting at `master_addr:master_port` (node 0
    hosts the meeting point: it must be reachable from every node)."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int

    def per_node(self, world: int) -> int:
        """Ranks each node starts for a job of `world` ranks (BadInput unless the nodes split it evenly)."""
        if world % self.nnodes:
            raise BadInput(f"--nnodes {self.nnodes} must divide the layout's {world} ranks (one share per node)")
        return world // self.nnodes

    def local_ranks(self, world: int) -> range:
        """The global ranks this node's torchrun starts (static rendezvous: node k holds k*n .. k*n+n-1)."""
        share = self.per_node(world)
        return range(self.node_rank * share, (self.node_rank + 1) * share)

    @property
    def reports(self) -> bool:
        """This node holds global rank 0 and prints the report; the others print one line with the verdict."""
        return self.node_rank == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def reports(nodes: Nodes | None) -> bool:
    """This launcher prints the report and writes files: a one-host run, or node 0 of several."""
    return nodes is None or nodes.reports


def make_nodes(nnodes: int, node_rank: int | None, master_addr: str | None, master_port: int | None) -> Nodes | None:
    """The Nodes of `--nnodes --node-rank --master-addr --master-port` (None for one node); BadInput naming the flag."""
    if nnodes < 1:
        raise BadInput(f"--nnodes must be a positive integer, got {nnodes}")
    if nnodes == 1:  # one node (e.g. a Slurm script run with SLURM_NNODES=1): the rendezvous flags have no use
        if node_rank not in (None, 0):
            raise BadInput(f"--node-rank must be 0 with --nnodes 1, got {node_rank}")
        return None
    missing = [f for f, v in (("--node-rank", node_rank), ("--master-addr", master_addr),
                              ("--master-port", master_port)) if v is None]  # fmt: skip
    if missing:
        raise BadInput(
            f"--nnodes {nnodes} needs {', '.join(missing)} (the same --master-addr and --master-port on every node)"
        )
    assert node_rank is not None and master_addr is not None and master_port is not None
    if not 0 <= node_rank < nnodes:
        raise BadInput(f"--node-rank must be in 0..{nnodes - 1}, got {node_rank}")
    if not 1 <= master_port <= 65535:
        raise BadInput(f"--master-port must be a TCP port (1..65535), got {master_port}")
    return Nodes(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=master_port)


def check_across_nodes(nodes: Nodes | None, world: int, oracles: tuple[str, ...]) -> None:
    """BadInput when a multi-node run cannot be split evenly or selects an oracle that needs one host."""
    if nodes is None:
        return
    nodes.per_node(world)
    bad = [name for name in oracles if name in ONE_NODE_ONLY]
    if bad:
        raise BadInput(
            f"the {', '.join(bad)} oracle{'s' if len(bad) > 1 else ''} write{'' if len(bad) > 1 else 's'} a folder "
            "that every rank reads back: run it on one node (without --nnodes)"
        )
