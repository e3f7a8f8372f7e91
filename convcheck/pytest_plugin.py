"""pytest plugin (entry point `pytest11: convcheck`): fixtures, markers and helpers for other repos' test suites.

Importing it stays light: torch, megatron and transformers load only when a fixture is used.
"""

from __future__ import annotations

import importlib
import inspect
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from convcheck import api
from convcheck.api import resolve_model
from convcheck.cache import cache_root
from convcheck.errors import BadInput, SetupError, one_line
from convcheck.hf.checkpoint import open_checkpoint
from convcheck.layout import ParallelLayout
from convcheck.verdict import Report

if TYPE_CHECKING:
    from convcheck.testing import assert_bitwise_equal, assert_same_checkpoint, assert_verdict_pass

__all__ = [
    "DEFAULT_MODEL",
    "assert_bitwise_equal",
    "assert_same_checkpoint",
    "assert_verdict_pass",
    "callable_spec",
    "convcheck_checkpoint",
    "convcheck_layout",
    "convcheck_ranks",
    "convcheck_verify",
]
_TESTING = ("assert_bitwise_equal", "assert_same_checkpoint", "assert_verdict_pass")
"""Re-exported from convcheck.testing, imported on first use: they take torch tensors, and the plugin, loaded into
every pytest process, stays free of torch until a test asks for them."""


def __getattr__(name: str) -> Any:
    if name in _TESTING:
        return getattr(importlib.import_module("convcheck.testing"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DEFAULT_MODEL = "tiny:qwen3"
"""The model the fixtures use when neither the `convcheck` marker nor a parametrisation names one."""

_MARKERS = (
    "convcheck(model): the model the convcheck fixtures use, tiny:<name> (default tiny:qwen3) or a checkpoint folder",
    "convcheck_layouts(*layouts): run the test once per layout ('tp1', 'tp2ep2', ...) as convcheck_layout; "
    + "a layout the model cannot take is skipped with the reason",
)
_ONE_LINE_ERRORS = (BadInput, SetupError)
_folders: dict[tuple[str, str], Path] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Register the plugin's markers (so --strict-markers accepts them)."""
    for line in _MARKERS:
        config.addinivalue_line("markers", line)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise a test carrying `convcheck_layouts(...)` over its layouts (indirectly, through convcheck_layout)."""
    marker = metafunc.definition.get_closest_marker("convcheck_layouts")
    if marker is None:
        return
    if "convcheck_layout" not in metafunc.fixturenames:
        pytest.fail(
            f"{metafunc.definition.nodeid}: the convcheck_layouts marker needs the test to use convcheck_layout, "
            "convcheck_verify or convcheck_ranks",
            pytrace=False,
        )
    layouts: list[ParallelLayout] = []
    problem = "names no layout"
    try:
        layouts = [_as_layout(value) for value in _flatten(marker.args)]
    except BadInput as exc:
        problem = str(exc)
    if not layouts:  # failed outside the except block, so the message is not chained to the BadInput
        pytest.fail(f"{metafunc.definition.nodeid}: convcheck_layouts: {problem}", pytrace=False)
    metafunc.parametrize("convcheck_layout", layouts, indirect=True, ids=[g.spec for g in layouts])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A bad input or a setup error in a test using convcheck fixtures is reported as one line, not a traceback."""
    report = yield
    excinfo = call.excinfo
    uses_convcheck = any(name.startswith("convcheck_") for name in getattr(item, "fixturenames", ()))
    if report.failed and excinfo is not None and uses_convcheck and excinfo.errisinstance(_ONE_LINE_ERRORS):
        where = next((e for e in reversed(excinfo.traceback) if e.path == getattr(item, "path", None)), None)
        prefix = f"{item.path.name}:{where.lineno + 1}: " if where is not None else ""
        report.longrepr = f"{prefix}{one_line(excinfo.value)}"
    return report


@pytest.fixture
def convcheck_checkpoint(request: pytest.FixtureRequest) -> Path:
    """The folder of the test's checkpoint: tiny:qwen3, or the model of the `convcheck` marker / an indirect param."""
    return checkpoint_folder(_test_model(request))


@pytest.fixture
def convcheck_layout(request: pytest.FixtureRequest) -> ParallelLayout:
    """The layout of this run of a `convcheck_layouts` test (TP1 elsewhere); one the model cannot take is skipped."""
    if not hasattr(request, "param"):
        return ParallelLayout()
    layout = _as_layout(request.param)

    folder = request.getfixturevalue("convcheck_checkpoint")
    try:
        layout.validate_for(open_checkpoint(folder).config)
    except BadInput as exc:
        pytest.skip(f"layout {layout.spec} is illegal for {_test_model(request)}: {exc}")
    return layout


@pytest.fixture
def convcheck_verify(
    request: pytest.FixtureRequest, convcheck_layout: ParallelLayout, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Report]:
    """`convcheck_verify(model=None, layout=None, *, tp=1, pp=1, ep=1, etp=1, vpp=1, pp_first=None, pp_last=None,
    pp_embed=False, pp_loss=False, oracles=None, hooks=(), sender=None,
    receiver=None, target_tp=None, target_ep=None, target_etp=None, **kw) -> Report`: one real verify run (target_*:
    the reshard oracle's target sizes, one or a list each; kw: any other keyword of convcheck.api.verify, e.g. device,
    experts, spec, timeout_s, log_dir, chunk_mb, pad_vocab, manifest_out, resume_layout)."""
    default_model = _test_model(request)
    test_layout = convcheck_layout if _layout_parametrized(request) else None

    def verify(
        model: str | os.PathLike[str] | None = None,
        layout: ParallelLayout | str | None = None,
        *,
        tp: int = 1,
        pp: int = 1,
        ep: int = 1,
        etp: int = 1,
        vpp: int = 1,
        pp_first: int | None = None,
        pp_last: int | None = None,
        pp_embed: bool = False,
        pp_loss: bool = False,
        oracles: Sequence[str] | str | None = None,
        hooks: Sequence[str | Callable[..., Any]] | str = (),
        sender: str | Callable[..., Any] | None = None,
        receiver: str | type | None = None,
        target_tp: int | Sequence[int] | None = None,
        target_ep: int | Sequence[int] | None = None,
        target_etp: int | Sequence[int] | None = None,
        **kw: Any,
    ) -> Report:
        sizes = {"tp": tp, "pp": pp, "ep": ep, "etp": etp, "vpp": vpp, "pp_first": pp_first, "pp_last": pp_last,
                 "pp_embed": pp_embed, "pp_loss": pp_loss}  # fmt: skip
        grid = _choose_layout(layout, sizes, test_layout, ParallelLayout())
        options = {**kw, **_adapter_options(sender=sender, receiver=receiver)}
        options |= {"target_tp": target_tp, "target_ep": target_ep, "target_etp": target_etp}
        options.setdefault("log_dir", str(tmp_path_factory.mktemp("convcheck-verify")))
        with reaping_ranks():
            return api.verify(str(model or default_model), grid, oracles=oracles, hooks=_hook_specs(hooks), **options)

    return verify


@pytest.fixture
def convcheck_engine_sync(convcheck_verify: Callable[..., Report]) -> Callable[..., Report]:
    """`convcheck_engine_sync(model=None, layout=None, *, sender=None, engine_receiver=None, engine_python=None,
    **kw) -> Report`: the engine oracle alone ("after my update, the engine computes exactly what it computes from
    this checkpoint"): your sender (rank side, FUNC(ctx)) streams the export into a real vLLM whose update your
    engine_receiver (engine side, FUNC(llm, weights), a module-level function or `FILE.py:FUNC`; default vLLM's
    reload_weights) performs; other keywords as convcheck_verify's (tp, ep, ..., chunk_mb, timeout_s)."""

    def sync(
        model: str | os.PathLike[str] | None = None,
        layout: ParallelLayout | str | None = None,
        *,
        engine_receiver: str | Callable[..., Any] | None = None,
        engine_python: str | None = None,
        **kw: Any,
    ) -> Report:
        options = {"engine_python": engine_python}
        if engine_receiver is not None:
            options["engine_receiver"] = callable_spec(engine_receiver, what="engine receiver")
        return convcheck_verify(model, layout, oracles="engine", options=options, **kw)

    return sync


@pytest.fixture
def convcheck_ranks(
    request: pytest.FixtureRequest, convcheck_layout: ParallelLayout, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Any]:
    """`convcheck_ranks(fn, layout=None, model=None, **kwargs)`: call the module-level `fn(ctx, **kwargs)` in every
    rank of the loaded sharded model and return rank 0's result (layout: the test's convcheck_layout, else tp2)."""
    default_model = _test_model(request)
    test_layout = convcheck_layout if _layout_parametrized(request) else None

    def ranks(
        fn: Callable[..., Any] | str,
        layout: ParallelLayout | str | None = None,
        model: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> Any:
        spec = callable_spec(fn, what="rank function")
        grid = _choose_layout(layout, {}, test_layout, ParallelLayout(tp=2))
        log_dir = str(tmp_path_factory.mktemp("convcheck-ranks"))
        with reaping_ranks():
            return api.run_in_ranks(spec, str(model or default_model), grid, kwargs=kwargs or None, log_dir=log_dir)

    return ranks


def checkpoint_folder(model: str | os.PathLike[str]) -> Path:
    """The checkpoint folder of `model` (a tiny fixture is built once and cached; a folder is validated)."""
    key = (str(model), str(cache_root()))
    if key not in _folders or not (_folders[key] / "config.json").is_file():
        folder = Path(resolve_model(key[0]))
        open_checkpoint(folder)
        _folders[key] = folder.resolve()
    return _folders[key]


def callable_spec(obj: Callable[..., Any] | str, *, what: str = "rank function") -> str:
    """`FILE.py:NAME` for a module-level function or class (the ranks import it by name); a string passes through."""
    if isinstance(obj, str):
        return obj
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        raise BadInput(f"{what} must be a module-level function or a 'FILE.py:FUNC' string, got {obj!r}")
    name = obj.__name__
    if name == "<lambda>":
        raise BadInput(f"{what} cannot be a lambda: every rank imports it by name; define it with def at module level")
    if obj.__qualname__ != name:
        raise BadInput(
            f"{what} {obj.__qualname__} is not defined at module level (a closure, nested function or method): "
            "every rank imports it by name from its file"
        )
    module = sys.modules.get(obj.__module__)
    try:
        source = inspect.getsourcefile(obj)
    except TypeError:
        source = None
    if getattr(module, name, None) is not obj or not source or not Path(source).is_file():
        raise BadInput(f"{what} {name} cannot be imported by name from a .py file (module {obj.__module__!r})")
    return f"{Path(source).resolve()}:{name}"


@contextmanager
def reaping_ranks(interval_s: float = 0.5) -> Iterator[None]:
    """Run a launch so that no rank outlives it: on an exception (a test timeout, an interrupt) or SIGTERM, every
    process it started is stopped."""
    reaper = _Reaper()
    watcher = threading.Thread(target=reaper.watch, args=(interval_s,), name="convcheck-reaper", daemon=True)
    watcher.start()
    with _stop_on_sigterm(reaper.stop):
        try:
            yield
        except BaseException:
            reaper.done.set()
            reaper.stop()
            raise
        finally:
            reaper.done.set()
            watcher.join()


class _Reaper:
    """Remembers every process started below this one since it was made (torchrun and its ranks, which run in
    sessions of their own and outlive torchrun), so they can be stopped."""

    def __init__(self) -> None:
        import psutil

        self.done = threading.Event()
        self.before = {p.pid for p in psutil.Process().children(recursive=True)}
        self.seen: dict[int, Any] = {}

    def snapshot(self) -> None:
        """Add the current descendants started since construction."""
        import psutil

        try:
            for proc in psutil.Process().children(recursive=True):
                if proc.pid not in self.before:
                    self.seen.setdefault(proc.pid, proc)
        except psutil.Error:
            pass

    def watch(self, interval_s: float) -> None:
        """Snapshot every `interval_s` seconds until `done` is set."""
        while not self.done.wait(interval_s):
            self.snapshot()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period, every remembered process still running."""
        import psutil

        self.snapshot()
        alive = [p for p in list(self.seen.values()) if p.is_running()]
        for proc in alive:
            try:
                proc.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(alive, timeout=10)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)


@contextmanager
def _stop_on_sigterm(stop: Callable[[], None]) -> Iterator[None]:
    """While inside, SIGTERM first stops the launch's processes, then terminates this process as before."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        stop()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _test_model(request: pytest.FixtureRequest) -> str:
    """The model of this test: an indirect convcheck_checkpoint param, else the convcheck marker, else the default."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "convcheck_checkpoint" in callspec.params:
        return str(callspec.params["convcheck_checkpoint"])
    marker = request.node.get_closest_marker("convcheck")
    if marker is not None:
        model = marker.kwargs.get("model", marker.args[0] if marker.args else None)
        if model:
            return str(model)
    return DEFAULT_MODEL


def _layout_parametrized(request: pytest.FixtureRequest) -> bool:
    """True when this test runs once per layout (convcheck_layouts marker or an indirect convcheck_layout param)."""
    callspec = getattr(request.node, "callspec", None)
    return callspec is not None and "convcheck_layout" in callspec.params


def _choose_layout(
    layout: ParallelLayout | str | None,
    sizes: dict[str, int | bool | None],
    test_layout: ParallelLayout | None,
    default: ParallelLayout,
) -> ParallelLayout:
    """The explicit layout, else the sizes (tp, pp, vpp, pp_first, ...) that are not at ParallelLayout's default, else
    the test's layout, else `default`."""
    plain = ParallelLayout()
    custom = {a: s for a, s in sizes.items() if s != getattr(plain, a)}
    if layout is not None and custom:
        raise BadInput(f"give either layout={layout!r} or {', '.join(f'{k}=' for k in custom)}, not both")
    if layout is not None:
        return _as_layout(layout)
    if custom:
        return ParallelLayout(**custom)
    return test_layout or default


def _as_layout(value: ParallelLayout | str) -> ParallelLayout:
    """A ParallelLayout from a layout or its spelling ("tp2ep2")."""
    if isinstance(value, ParallelLayout):
        return value
    if not isinstance(value, str):
        raise BadInput(f"a layout is a ParallelLayout or a string such as 'tp2ep2', got {value!r}")
    return ParallelLayout.parse(value)


def _flatten(values: Sequence[Any]) -> list[Any]:
    """Marker arguments given one by one or as one list/tuple."""
    out: list[Any] = []
    for value in values:
        out.extend(value if isinstance(value, (list, tuple)) else [value])
    return out


def _hook_specs(hooks: Sequence[str | Callable[..., Any]] | str | Callable[..., Any]) -> tuple[str, ...]:
    """Hook specs from strings or module-level functions."""
    if isinstance(hooks, str) or callable(hooks):
        hooks = [hooks]
    return tuple(callable_spec(h, what="hook") for h in hooks)


def _adapter_options(**adapters: Any) -> dict[str, Any]:
    """`sender` / `receiver` as specs (strings or module-level callables), only those given."""
    return {name: callable_spec(value, what=name) for name, value in adapters.items() if value is not None}
