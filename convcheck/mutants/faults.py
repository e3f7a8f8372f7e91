"""Rank faults, not conversion bugs: hooks that make a rank die, hang or raise, for the launcher's and report tests.

Each runs in every rank before the model is built; the mid-run ones patch the real bridge (or an oracle's module
function) so the fault strikes later, while the ranks are inside the import, the export or an oracle.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import convcheck.boot  # noqa: F401 - the TE import stand-in, before megatron.bridge

from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge

from convcheck.mutants.patch import wrap
from convcheck.oracles import coverage

TENSORS_BEFORE_FAULT = 3
"""How many tensors the export stream yields before a mid-export fault strikes."""


def kill_rank1() -> None:
    """Rank 1 dies abruptly before the model is built."""
    if os.environ.get("RANK") == "1":
        os._exit(9)


def hang_rank1() -> None:
    """Rank 1 hangs (never joins the next collective)."""
    if os.environ.get("RANK") == "1":
        time.sleep(3600)


def setup_raises() -> None:
    """Every rank raises a plain RuntimeError before the model is built (e.g. transformers rejecting a config)."""
    raise RuntimeError("planted fault: the model config was rejected before the model was built")


def import_raises() -> None:
    """The bridge's HF -> Megatron import raises in every rank, before it writes any parameter."""

    def make(original: Any) -> Any:
        def load_weights_hf_to_megatron(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise RuntimeError("planted fault: load_weights_hf_to_megatron raised")

        return load_weights_hf_to_megatron

    wrap(MegatronModelBridge, "load_weights_hf_to_megatron", make)


def _fault_in_export(fault: Callable[[], None]) -> None:
    """Wrap the bridge's export stream so that `fault()` runs after TENSORS_BEFORE_FAULT yielded tensors."""

    def make(original: Any) -> Any:
        def stream_weights_megatron_to_hf(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            for count, item in enumerate(original(self, *args, **kwargs)):
                if count == TENSORS_BEFORE_FAULT:
                    fault()
                yield item

        return stream_weights_megatron_to_hf

    wrap(MegatronModelBridge, "stream_weights_megatron_to_hf", make)


def export_raises() -> None:
    """The bridge's export stream raises in every rank after a few tensors (the same point on every rank)."""

    def fault() -> None:
        raise RuntimeError(f"planted fault: the export stream raised after {TENSORS_BEFORE_FAULT} tensors")

    _fault_in_export(fault)


def _is_last_rank() -> bool:
    return os.environ.get("RANK", "0") == str(int(os.environ.get("WORLD_SIZE", "1")) - 1)


def export_raises_on_last_rank() -> None:
    """The bridge's export stream raises on the last rank only, after a few tensors: its peers wait in the export's
    next collective for good (a bridge bug of one rank's share, e.g. a mapping only that rank's stage holds)."""
    if _is_last_rank():

        def fault() -> None:
            raise RuntimeError(f"planted fault: the export raised on the last rank only after {TENSORS_BEFORE_FAULT}")

        _fault_in_export(fault)


def import_raises_on_last_rank() -> None:
    """The bridge's HF -> Megatron import raises on the last rank only (its peers go on and wait in the next
    collective the last rank never joins)."""
    if _is_last_rank():
        import_raises()


def kill_last_rank_mid_export() -> None:
    """The last rank dies abruptly in the middle of the export stream (its peers, if any, wait in a gather)."""
    if _is_last_rank():
        _fault_in_export(lambda: os._exit(9))


def hang_last_rank_mid_export() -> None:
    """The last rank stops in the middle of the export stream and never returns (its peers wait in a gather)."""
    if _is_last_rank():
        _fault_in_export(lambda: time.sleep(3600))


def coverage_raises_on_rank1() -> None:
    """The coverage oracle's own code raises on rank 1 only (a convcheck bug, not a bridge one); rank 0 goes on."""
    if os.environ.get("RANK") != "1":
        return

    def make(original: Any) -> Any:
        def megatron_side(ctx: Any, *args: Any) -> Any:
            raise ValueError("planted fault in the coverage oracle on rank 1")

        return megatron_side

    wrap(coverage, "megatron_side", make)
