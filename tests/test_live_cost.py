"""The live check's cost cuts leave the job's state as they found it (convcheck.live.check.collector_paused)."""

from __future__ import annotations

import gc

import pytest

from convcheck.live.check import collector_paused


def test_the_collector_is_paused_and_restored_also_on_error() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyboardInterrupt), collector_paused():
        raise KeyboardInterrupt
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a job that runs without the collector keeps it off
    finally:
        gc.enable()
