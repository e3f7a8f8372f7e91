"""A warm server (`convcheck.engine.warm`) for the CPU launches and child processes of a block of code; the protocol
that talks to it is `convcheck.fork.client`."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from convcheck.fork.client import SOCKET_ENV
from convcheck.rollout.lifeline import server_for_block

SERVER_PREFIX = "convcheck-tmp-"
"""A server's folder is /tmp/convcheck-tmp-<pid of its launcher>-warm*: swept as the ranks' short TMPDIRs are
(`convcheck.engine.launch.sweep_orphans`) once that launcher is gone."""


@contextmanager
def serving(wait_s: float = 0.0) -> Iterator[str]:
    """A warm server for this process's CPU launches while the block runs ($CONVCHECK_WARM_SOCKET set; an existing
    one is kept), stopped and its folder removed after. Waits up to `wait_s` for it to be ready; launches before
    that use torchrun."""
    command = [sys.executable, "-m", "convcheck.engine.warm"]
    with server_for_block(command, SOCKET_ENV, f"{SERVER_PREFIX}{os.getpid()}-warm", wait_s) as path:
        yield path
