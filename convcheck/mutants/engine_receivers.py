"""Planted engine-side receivers (`--engine-receiver convcheck.mutants.engine_receivers:NAME`), called inside the
engine process as FUNC(llm, weights): the update code RL frameworks get wrong. Imports only what the engine's
environment has."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

STALE_LAYER = "model.layers.1."
"""reload_leaving_a_layer_stale never hands these tensors to the engine."""


def _model(llm: Any) -> Any:
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()


def load_weights_directly(llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """`model.load_weights(...)` on the loaded engine, skipping vLLM's reload path: the CPU backend has packed its
    dense weights away (parameters of shape (0,)), so this raises or leaves the packed copies stale."""
    _model(llm).load_weights(weights)


def reload_leaving_a_layer_stale(llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """vLLM's reload_weights, handed every tensor but those of layer 1 (which keeps what it had)."""

    def kept() -> Iterator[tuple[str, Any]]:
        for name, tensor in weights:
            if not name.startswith(STALE_LAYER):
                yield name, tensor

    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": kept()})


_SYNCS = [0]
"""How many syncs reload_dropping_a_delta_tensor has taken in this engine process."""


def reload_dropping_a_delta_tensor(llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """vLLM's reload_weights for the full syncs; from the third sync on (the delta after the oracle's two full syncs)
    the first tensor handed over is dropped: a delta path that loses one tensor."""
    _SYNCS[0] += 1
    items = iter(weights)
    if _SYNCS[0] > 2:
        next(items, None)
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})


def reload_weights(llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """What the default receiver does, spelled as a user's function (FILE.py:FUNC receivers look like this)."""
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})


def exit_mid_sync(llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """The engine process dies after taking the first tensor (a crash inside the engine mid-sync)."""
    import os

    next(iter(weights))
    os._exit(17)


def hang_mid_sync(llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """The engine stops answering after taking the first tensor (a deadlock inside the engine mid-sync)."""
    import time

    next(iter(weights))
    while True:
        time.sleep(1)
