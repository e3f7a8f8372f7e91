"""The small exception hierarchy of convcheck."""

from __future__ import annotations

from dataclasses import dataclass


class ConvcheckError(Exception):
    """Base of every error convcheck raises on purpose."""


class BadInput(ConvcheckError):
    """The user's input (checkpoint, model name, layout, option) cannot be used; exit code 2."""


class MappingError(ConvcheckError):
    """A mapping cannot be built or applied (impossible geometry, missing or misshapen tensor, rank off the grid)."""


class NotCovered(MappingError):
    """convcheck has no explicit mappings (or config table, or CPU forward) for this model family: a gap in convcheck,
    reported as a `not-covered` verdict, never as a bridge bug."""


class BuildFailed(ConvcheckError):
    """The bridge's provider or model build raised on a valid checkpoint and layout: a bridge bug, reported as a
    `<build> build-failed` finding of every oracle (exit 1), never as bad input."""


class SetupError(ConvcheckError):
    """The environment or a rank failed before any verdict could be reached; exit code 2."""


class NodeLost(SetupError):
    """A node of a multi-node run never came, went away or was stopped: no later launch of the run can meet; exit 2."""


class NodesDisagree(BadInput):
    """The nodes of a multi-node run were started with other arguments; exit 2 before any rank starts."""


RUN_ENDING = (NodeLost, NodesDisagree)
"""Errors that end a whole multi-launch run (gate, selftest) on every node instead of only the launch that met them."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its class name when the message is empty."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


def one_line(exc: BaseException) -> str:
    """`ExcType: first line of the message` (how every raised upstream error is reported)."""
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {first_line(exc)}" if text else exc.__class__.__name__


def raised_at(exc: BaseException, depth: int = 3) -> str:
    """`file:line` of the innermost `depth` frames that raised, innermost first (paths cut after site-packages)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return " <- ".join(f"{f.filename.rpartition('site-packages/')[2]}:{f.lineno}" for f in reversed(frames[-depth:]))


_NO_CUDA = (
    "Found no NVIDIA driver",
    "Torch not compiled with CUDA enabled",
    "No CUDA GPUs are available",
    "Cannot re-initialize CUDA in forked subprocess",  # a CPU run's rank forked from the warm server
)


def needs_cuda(exc: BaseException) -> bool:
    """True when `exc` is torch saying there is no CUDA device: on a CPU run, upstream code convcheck has no CPU shim
    for (a limit of convcheck's CPU runs, never a bridge bug)."""
    return any(text in str(exc) for text in _NO_CUDA)


@dataclass
class LoneFailure(Exception):
    """The bridge raised on `rank` in `stage` while `waiting` ranks stayed in its collectives."""

    stage: str
    """What raised: "import" (bridge.load_hf_weights) or "export" (bridge.export_hf_weights)."""
    rank: int
    error: str
    """The bridge's exception, one line with where it was raised."""
    waiting: tuple[int, ...]
    grace_s: float
    oracle: str = ""
    """The oracle whose run it stopped ("" for the import, which runs before every oracle)."""

    def __str__(self) -> str:
        call = {"import": "bridge.load_hf_weights", "export": "bridge.export_hf_weights"}.get(self.stage, self.stage)
        ranks = ", ".join(map(str, self.waiting))
        return (
            f"{call} raised on rank {self.rank} only: {self.error}; rank{'s' if len(self.waiting) > 1 else ''} "
            f"{ranks} still waited in its collectives {self.grace_s:g} s later, and the run stopped there"
        )
