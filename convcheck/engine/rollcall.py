"""Where the launchers of a multi-node run meet: a key-value store node 0's launcher hosts for its whole life.

Per launch (numbered in the order every node makes them) each launcher checks in with the job it was asked to run,
learns the rendezvous port node 0 picked for torchrun, and after its ranks ended posts how they ended; node 0 posts
rank 0's result. Every launcher then ends the same way, and a node that never came or died is named.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

from convcheck.engine.nodes import Nodes
from convcheck.engine.store import StoreClient, StoreError, StoreServer
from convcheck.errors import BadInput, NodeLost, NodesDisagree, SetupError

EXIT_GRACE_S = 30.0
"""How long a launcher whose ranks ended waits for the other nodes' ends before naming the missing ones."""

SILENT_S = 15.0
"""A node whose launcher has not beaten for this long (while its ranks should run) is taken for dead."""

BEAT_S = 1.0
"""How often a launcher beats (and looks at the others) while its ranks run or it waits for the others' ends."""

FOLLOWED = "stopped after node"
"""How a node that stopped its ranks because another node ended badly first says so."""

PEER_LOSS = ("connection closed by peer", "connection reset by peer", "broken pipe", "econnreset",
             "connection refused", "died without reporting an error", FOLLOWED)  # fmt: skip
"""What a rank says when it failed only because a rank of another node went away first."""


READ_GRACE_S = 10.0
"""How long node 0, which hosts the meeting's store, waits for the other nodes to read every node's job before it
exits on a disagreement (closing the store under a node still reading would turn that node's line into a lost store)."""


@dataclass
class Meeting:
    """One launcher's connection to the run's meeting point (node 0 hosts it)."""

    nodes: Nodes
    store: StoreClient
    launches: int = 0
    """Launches made so far through this meeting (the next one's number)."""

    def _key(self, launch: int, what: str, node: int | None = None) -> str:
        return f"convcheck/{launch}/{what}" + ("" if node is None else f"/{node}")

    def _wait(self, keys: list[str], timeout_s: float) -> list[str]:
        """The keys still missing after waiting up to `timeout_s` for all of them."""
        try:
            self.store.wait(keys, max(timeout_s, 0.1))
            return []
        except StoreError:
            return [key for key in keys if not self._has(key)]

    def _has(self, key: str) -> bool:
        try:
            return bool(self.store.check([key]))
        except RuntimeError as exc:
            raise _host_lost(self.nodes, exc) from None

    def next_launch(self) -> int:
        """The number of the next launch made through this meeting (every node numbers them in the same order)."""
        launch, self.launches = self.launches, self.launches + 1
        return launch

    def check_in(self, launch: int, job: dict[str, Any], timeout_s: float) -> None:
        """Post this node's job and wait for every node's; NodeLost naming the nodes that never came, NodesDisagree
        when a node was started with another job."""
        me = self.nodes.node_rank
        try:
            self.store.set(self._key(launch, "job", me), json.dumps(job, sort_keys=True))
        except RuntimeError as exc:
            raise _host_lost(self.nodes, exc) from None
        keys = [self._key(launch, "job", node) for node in range(self.nodes.nnodes)]
        missing = self._wait(keys, timeout_s)
        if missing:
            absent = ", ".join(k.rsplit("/", 1)[1] for k in missing)
            raise NodeLost(
                f"node {absent} never joined the run at {self.nodes.master_addr}:{self.nodes.master_port} within "
                f"{timeout_s:g} s (start one launcher per node with the same --nnodes, --master-addr and --master-port)"
            )
        jobs = [json.loads(self.store.get(key)) for key in keys]
        try:
            self.store.set(self._key(launch, "read", me), "1")
        except RuntimeError as exc:
            raise _host_lost(self.nodes, exc) from None
        for node, other in enumerate(jobs):
            if other != jobs[0]:
                if me == 0:  # the store's host: every node reads the jobs (and disagrees too) before it goes away
                    reads = [self._key(launch, "read", n) for n in range(self.nodes.nnodes)]
                    self._wait(reads, min(timeout_s, READ_GRACE_S))
                # options first, then the per-item entries of a whole run ("case qwen3/tp2", agree below)
                fields = sorted((k for k in {*other, *jobs[0]} if other.get(k) != jobs[0].get(k)),
                                key=lambda k: (" " in k, k))  # fmt: skip
                named = ", ".join(fields[:6]) + (f" and {len(fields) - 6} more" if len(fields) > 6 else "")
                raise NodesDisagree(
                    f"node {node} was started with another job than node 0 ({named} differ): start every node with "
                    "the same arguments"
                )

    def torchrun_port(self, launch: int, timeout_s: float) -> int:
        """The port torchrun's rendezvous of this launch uses on node 0 (node 0 picks a free one and posts it)."""
        key = self._key(launch, "port")
        if self.nodes.node_rank == 0:
            self.store.set(key, str(free_port()))
        if self._wait([key], timeout_s):
            raise SetupError(f"node 0 did not post the rendezvous port of launch {launch} within {timeout_s:g} s")
        return int(self.store.get(key))

    def post_end(self, launch: int, end: dict[str, Any]) -> None:
        """Post how this node's ranks ended: {"kind": "ok" | "bad_input" | "error" | "gone" (its launcher was
        stopped), "error": line, "result": ...}."""
        try:
            self.store.set(self._key(launch, "end", self.nodes.node_rank), json.dumps(end))
        except RuntimeError as exc:
            raise _host_lost(self.nodes, exc) from None

    def _end(self, launch: int, node: int) -> dict[str, Any] | None:
        key = self._key(launch, "end", node)
        return json.loads(self.store.get(key)) if self._has(key) else None

    def watcher(self, launch: int) -> Callable[[], None]:
        """A check to call while this node's ranks run: it beats for this node and raises SetupError as soon as
        another node ended badly or went silent (its launcher killed outright), so these ranks stop at once."""
        pulse = _Pulse(self, launch)

        def watch() -> None:
            for node in pulse.due():
                end = self._end(launch, node)
                if end is not None and end["kind"] != "ok":
                    raise SetupError(f"{FOLLOWED} {node} ended: {end['error']}")
            silent = pulse.silent(lambda node: self._end(launch, node) is not None)
            if silent:
                raise SetupError(f"node {silent[0]} went silent for {SILENT_S:g} s (its launcher died or was killed)")

        return watch

    def ends(self, launch: int, grace_s: float = EXIT_GRACE_S) -> dict[int, dict[str, Any] | None]:
        """Node -> how its ranks ended (None: it posted nothing: its launcher died or was stopped), waiting up to
        `grace_s` and no longer than a silent node's silence (this node beats meanwhile)."""
        pulse = _Pulse(self, launch)
        deadline = time.monotonic() + grace_s
        ends: dict[int, dict[str, Any] | None] = {}
        while True:
            for node in range(self.nodes.nnodes):
                if ends.get(node) is None:
                    ends[node] = self._end(launch, node)
            pulse.due()
            waiting = [node for node, end in ends.items() if end is None]
            if not waiting or time.monotonic() >= deadline:
                return ends
            if set(waiting) <= set(pulse.silent(lambda node: ends.get(node) is not None)):
                return ends
            time.sleep(0.2)

    def leave(self, launch: int, timeout_s: float = 10.0) -> None:
        """Say this node has read every end; node 0 (whose exit closes the store) waits until every node has."""
        self.store.set(self._key(launch, "left", self.nodes.node_rank), "1")
        if self.nodes.node_rank == 0:
            self._wait([self._key(launch, "left", node) for node in range(self.nodes.nnodes)], timeout_s)


class _Pulse:
    """This node's heartbeat in a launch and the others' as seen from here (counters: no clock is compared)."""

    def __init__(self, meet: Meeting, launch: int) -> None:
        self.meet, self.launch = meet, launch
        self.others = [n for n in range(meet.nodes.nnodes) if n != meet.nodes.node_rank]
        now = time.monotonic()
        self.seen = {node: (-1, now) for node in self.others}
        self.last = 0.0

    def _count(self, node: int, step: int) -> int:
        try:
            return int(self.meet.store.add(self.meet._key(self.launch, "beat", node), step))
        except RuntimeError as exc:
            raise _host_lost(self.meet.nodes, exc) from None

    def due(self) -> list[int]:
        """Beat once a BEAT_S and read the others' beats; the other nodes when it was time, else []."""
        now = time.monotonic()
        if now - self.last < BEAT_S:
            return []
        self.last = now
        self._count(self.meet.nodes.node_rank, 1)
        for node in self.others:
            count = self._count(node, 0)
            if count != self.seen[node][0]:
                self.seen[node] = (count, now)
        return self.others

    def silent(self, done: Callable[[int], bool]) -> list[int]:
        """The other nodes without a beat for SILENT_S that have not posted their end (`done`)."""
        now = time.monotonic()
        return [node for node in self.others if now - self.seen[node][1] > SILENT_S and not done(node)]


def decide(nodes: Nodes, ends: dict[int, dict[str, Any] | None]) -> dict[str, Any]:
    """Rank 0's result when every node's ranks ended well; else the one error every launcher raises."""
    gone = [node for node, end in ends.items() if end is None]
    if gone:
        listed = ", ".join(map(str, gone))
        raise NodeLost(
            f"node {listed} stopped without reporting its ranks' end (its launcher died or was stopped); "
            f"stopped the ranks of node {nodes.node_rank}"
        )
    failed = {node: end for node, end in ends.items() if end and end["kind"] != "ok"}
    if not failed:
        result = ends[0] and ends[0].get("result")
        if not result:
            raise SetupError("node 0's ranks ended without rank 0's result")
        return result
    stopped = [node for node, end in failed.items() if end["kind"] == "gone"]
    if stopped:  # its launcher was interrupted: it makes no further launch
        raise NodeLost(f"node {stopped[0]}: {failed[stopped[0]]['error']}")
    bad = [node for node, end in failed.items() if end["kind"] == "bad_input"]
    if bad:
        raise BadInput(f"node {bad[0]}: {failed[bad[0]]['error']}")
    causes = [node for node, end in failed.items() if not _peer_loss(end["error"])] or sorted(failed)
    node = causes[0]
    others = sorted(set(failed) - {node})
    also = f"; node {', '.join(map(str, others))} then stopped" if others else ""
    raise SetupError(f"node {node}: {failed[node]['error']}{also}")


def _peer_loss(error: str) -> bool:
    return any(text in error.lower() for text in PEER_LOSS)


def _host_lost(nodes: Nodes, exc: BaseException) -> NodeLost:
    return NodeLost(
        f"lost node 0's meeting point {nodes.master_addr}:{nodes.master_port} (its launcher died or was stopped): {exc}"
    )


def agree(nodes: Nodes, run: dict[str, Any], timeout_s: float) -> None:
    """Before the first launch of a multi-launch run (gate, selftest) every node posts the whole run it was asked (its
    cases, golden digests, ...) as one launch of the meeting; NodesDisagree names what differs, before any rank."""
    meet = meeting(nodes, timeout_s)
    launch = meet.next_launch()
    try:
        meet.check_in(launch, run, timeout_s)
    except NodesDisagree:
        meet.leave(launch, timeout_s=5.0)  # node 0 keeps the store up until every node has read why
        raise


def free_port() -> int:
    """A TCP port free on this host now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


_SERVERS: dict[tuple[str, int, int, int], StoreServer] = {}
"""Node 0's store server per meeting, serving until this launcher process exits."""
_MEETINGS: dict[tuple[str, int, int, int], Meeting] = {}
"""This launcher process's meeting per (address, port, nnodes, node): node 0's store must outlive every launch of
the process (a gate check or selftest makes many), so it is made once and kept."""


def meeting(nodes: Nodes, timeout_s: float) -> Meeting:
    """This process's Meeting for `nodes` (node 0 hosts the store; the others connect, retrying up to `timeout_s`)."""
    key = (nodes.master_addr, nodes.master_port, nodes.nnodes, nodes.node_rank)
    if key in _MEETINGS:
        return _MEETINGS[key]
    started = time.monotonic()
    host = nodes.node_rank == 0
    if host:
        try:
            _SERVERS[key] = StoreServer(nodes.master_port)
        except OSError as exc:
            raise BadInput(
                f"node 0 cannot listen on --master-port {nodes.master_port} of {nodes.master_addr}: {exc}"
            ) from None
    try:
        store = StoreClient("127.0.0.1" if host else nodes.master_addr, nodes.master_port, timeout_s)
    except StoreError:
        raise SetupError(
            f"node {nodes.node_rank} could not reach node 0 at {nodes.master_addr}:{nodes.master_port} within "
            f"{time.monotonic() - started:.0f} s (node 0 not started, or the address is not reachable from here)"
        ) from None
    _MEETINGS[key] = Meeting(nodes=nodes, store=store)
    return _MEETINGS[key]
