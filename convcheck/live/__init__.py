"""convcheck inside a running job: the oracles that need no HF source, run collectively on the job's own model chunks,
AutoBridge and process groups (`check`), and the digest manifest of its export (`digest`). docs/live.md."""

from convcheck.live.agreement import LiveFailure
from convcheck.live.check import check, digest

__all__ = ["LiveFailure", "check", "digest"]
