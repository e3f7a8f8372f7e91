"""This process's resident memory, for measurements that must stay flat as the model grows (Linux /proc)."""

from __future__ import annotations

from pathlib import Path


def reset_peak() -> None:
    """Start a new high-water mark for this process ("5" > /proc/self/clear_refs; elsewhere nothing)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def memory_mb() -> dict[str, float]:
    """Resident set now, its high-water mark since the last reset and its anonymous part (VmRSS, VmHWM, RssAnon), in
    MB; empty where unknown."""
    out = {}
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def anon_mb() -> float:
    """Anonymous resident memory now (RssAnon: heap and tensors, not mapped file pages), in MB; -1 where unknown."""
    return memory_mb().get("RssAnon", -1.0)


class AnonPeak:
    """The highest RssAnon a background thread sees (sampled every `every` seconds) since the last take()."""

    def __init__(self, every: float = 0.02) -> None:
        import threading

        self._peak = anon_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(every,), name="convcheck-anon-peak", daemon=True)
        self._thread.start()

    def _sample(self, every: float) -> None:
        while not self._stop.wait(every):
            self._peak = max(self._peak, anon_mb())

    def take(self) -> float:
        """The peak since the previous take (including now), and start a new one."""
        now = anon_mb()
        peak, self._peak = max(self._peak, now), now
        return peak

    def stop(self) -> None:
        self._stop.set()


def trim() -> None:
    """Hand freed heap pages back to the system (glibc malloc_trim), so one phase's garbage is not the next's RSS."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)  # the C library this process already runs on
    except (OSError, AttributeError):  # not glibc
        pass
