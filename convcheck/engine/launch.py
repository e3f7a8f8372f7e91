"""Launch the ranks of one job with torchrun, bounded in time and cancellable, and turn what they leave into a result.

The ranks run in their own process session; the launcher owns it: on a timeout, SIGINT or SIGTERM it stops the whole
group (SIGTERM, then SIGKILL), and torchrun is started with a parent-death signal (and each rank sets one on its
torchrun), so even a SIGKILLed launcher leaves no rank behind. Without `log_dir` the job's folder is temporary and is
removed when the run ends, except after a setup error, whose message names the kept log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from convcheck.cache import cache_root
from convcheck.engine.job import Job
from convcheck.engine.nodes import Nodes
from convcheck.engine.outcome import read_result
from convcheck.engine.rollcall import decide, meeting
from convcheck.errors import BadInput, SetupError
from convcheck.fork.client import WarmTimeout, run_warm, warm_socket
from convcheck.progress import ProgressReader, ProgressSink
from convcheck.rollout.lifeline import die_with_parent
from convcheck.rollout.segments import sweep_stale

LAUNCHED = "CONVCHECK_LAUNCHED"
"""Set in the environment of the ranks convcheck starts (convcheck.engine.inplace tells them from torchrun's own)."""

STOP_GRACE_S = 5.0
"""How long the ranks get to exit after SIGTERM before SIGKILL."""


class Interrupted(BaseException):
    """The run was cancelled by SIGINT or SIGTERM (like KeyboardInterrupt, no ordinary `except` stops it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}; stopped all ranks")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as shells report it (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


def torchrun_command(job_file: Path, nproc: int, nodes: Nodes | None = None, port: int = 0) -> list[str]:
    """The torchrun command line for `nproc` ranks of the worker on this node: --standalone (a free rendezvous port)
    on one node; across nodes, a static rendezvous at node 0's `port` with this node's rank."""
    where = ["--standalone"]
    if nodes is not None:
        where = [f"--nnodes={nodes.nnodes}", f"--node-rank={nodes.node_rank}", f"--master-addr={nodes.master_addr}",
                 f"--master-port={port}"]  # fmt: skip
    return [
        sys.executable, "-m", "torch.distributed.run", *where, f"--nproc-per-node={nproc}",
        "-m", "convcheck.engine.worker", str(job_file),
    ]  # fmt: skip


def rank_env(device: str, tmpdir: Path | None = None) -> dict[str, str]:
    """Environment for the ranks: one thread each, unbuffered output, no GPU on CPU runs, NVLink multicast off."""
    env = dict(os.environ)
    env[LAUNCHED] = "1"  # a `convcheck` run inside these ranks launches its own, it is not one of them
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if tmpdir is not None:  # torchrun's torchelastic_* folders land inside the job folder and go with it
        env["TMPDIR"] = str(tmpdir)
    # torch.compile'd upstream code (e.g. Megatron's jit_fuser activations) keeps its compiled kernels in convcheck's
    # cache, keyed by inductor/triton by the graph and compiler, instead of under the job's TMPDIR (recompiled by
    # every launch: ~12 s of a tiny NemotronH run on 2 cores)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "torch-compile" / "inductor"))
    env.setdefault("TRITON_CACHE_DIR", str(cache_root() / "torch-compile" / "triton"))
    if device == "cpu":
        # A CPU run on a GPU host hides the GPUs from its ranks: upstream code that asks "is CUDA available?" then
        # takes its CPU path, no rank creates a CUDA context, and nothing is allocated on (or blocks) the GPUs.
        env["CUDA_VISIBLE_DEVICES"] = ""
    if device == "cuda":
        env["NCCL_NVLS_ENABLE"] = "0"
        env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
        env["NVSHMEM_DISABLE_NVLS"] = "1"
    return env


def _start_session() -> None:
    """Child-side setup of torchrun: its own session (one group to signal), dead with the launcher."""
    os.setsid()
    die_with_parent()


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group of `proc`, then SIGKILL what is left after `grace_s`."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:  # torchrun exited: make sure no rank of its group outlived it
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        break


class _Signals:
    """While active, SIGINT and SIGTERM raise Interrupted; on leaving, the signal goes on to the earlier handler."""

    def __enter__(self) -> "_Signals":
        self.saved: dict[int, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                previous = signal.getsignal(sig)
                if previous is not signal.SIG_IGN:
                    self.saved[sig] = signal.signal(sig, self._raise)
            except ValueError:  # not the main thread: leave handlers alone
                pass
        return self

    @staticmethod
    def _raise(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    def __exit__(self, _type: Any, exc: BaseException | None, _tb: Any) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        if isinstance(exc, Interrupted) and exc.signum in self.saved:
            _redeliver(exc, self.saved[exc.signum])


def _redeliver(exc: Interrupted, handler: Any) -> None:
    """Hand a signal the launcher caught (ranks stopped, temp folder gone) to the handler the caller had."""
    if callable(handler):  # Python's SIGINT default raises KeyboardInterrupt; a pytest plugin's may exit
        handler(exc.signum, None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), exc.signum)  # the default action, as if the launcher had never been here
        time.sleep(1.0)


def prepare_workdir(log_dir: str | None) -> tuple[Path, bool]:
    """The job folder and whether it is temporary; a reused log dir loses the previous run's result and errors."""
    if not log_dir:
        return Path(tempfile.mkdtemp(prefix="convcheck-")), True
    workdir = Path(log_dir)
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in [*workdir.glob("rank*.error.json"), workdir / "result.json", workdir / "value.pkl",
                  workdir / "progress.jsonl"]:  # fmt: skip
        stale.unlink(missing_ok=True)
    return workdir, False


def run_ranks(job: Job, log_dir: str | None = None, progress: ProgressSink | None = None) -> dict[str, Any]:
    """Run `job` under torchrun; return rank 0's result dict, or raise BadInput / SetupError / Interrupted."""
    with _Signals():  # a signal is passed on only after the ranks are stopped and the temp folder removed
        workdir, keep = None, True
        try:
            workdir, temporary = prepare_workdir(log_dir)
            keep = not temporary
            job = replace(job, workdir=str(workdir))
            result = _launch(job, workdir, progress)
        except SetupError:
            keep = True  # its message names the log in this folder
            raise
        finally:
            if workdir is not None and not keep:
                shutil.rmtree(workdir, ignore_errors=True)
    return result


def _launch(job: Job, workdir: Path, progress: ProgressSink | None) -> dict[str, Any]:
    job_file = job.save()
    log_file = workdir / "ranks.log"
    tmpdir = rank_tmpdir(workdir)
    try:
        return _launch_with(job, job_file, log_file, tmpdir, progress)
    finally:
        sweep_stale()  # shared-memory buckets of ranks that were killed (convcheck.rollout.segments)
        sweep_stale(tmpdir)  # and the engine's sync folders (--engine-transport folder) under the ranks' TMPDIR
        if tmpdir.parent != workdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


TMPDIR_MAX = 64
"""Longest TMPDIR the ranks get: multiprocessing puts AF_UNIX listeners at TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX,
and a socket path over 107 bytes makes megatron-core's checkpoint save fail with EOFError."""


def rank_tmpdir(workdir: Path) -> Path:
    """The ranks' TMPDIR: `workdir`/tmp, or a short folder of its own under the system temp dir (under /tmp when that
    too is deep) when that path is too long for a socket (a deep --log-dir); the caller removes the latter."""
    tmpdir = workdir / "tmp"
    if len(str(tmpdir)) <= TMPDIR_MAX:
        tmpdir.mkdir(exist_ok=True)
        return tmpdir
    prefix = f"{SHORT_PREFIX}{os.getpid()}-"
    short = Path(tempfile.mkdtemp(prefix=prefix))
    if len(str(short)) > TMPDIR_MAX:
        short.rmdir()  # the system temp dir is itself too deep (a long $TMPDIR): use /tmp
        short = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    for folder in {short.parent, Path("/tmp")}:
        sweep_orphans(folder)
    return short


SHORT_PREFIX = "convcheck-tmp-"
"""Short rank TMPDIRs are named `convcheck-tmp-<pid of the launching process>-XXXX`."""


def sweep_orphans(folder: Path) -> None:
    """Remove short rank TMPDIRs whose launching process is gone (it was killed before its cleanup could run)."""
    for path in folder.glob(f"{SHORT_PREFIX}*-*"):
        pid = path.name[len(SHORT_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def _launch_with(
    job: Job, job_file: Path, log_file: Path, tmpdir: Path, progress: ProgressSink | None
) -> dict[str, Any]:
    reader = ProgressReader(job.progress_file)
    if progress is not None:
        progress({"phase": "starting ranks", "world": job.layout.world_size})
    env = rank_env(job.device, tmpdir)
    started = time.monotonic()
    if job.nodes is not None:
        return _launch_across(job, job_file, log_file, env, reader, progress)
    warm = warm_socket(job.device)
    if warm is not None:
        for attempt in range(PORT_RETRIES + 1):
            exits = _launch_warm(warm, job, job_file, log_file, env, reader, progress)
            if exits is None:
                break
            code = 0 if all(c == 0 for _, c in exits) else 1
            if code == 0 or attempt == PORT_RETRIES or not _port_taken(log_file):
                return read_result(job, code, log_file, started, exits, launcher="warm agent")
            forget_attempt(job, log_file)
    for attempt in range(PORT_RETRIES + 1):
        code = _torchrun(job, job_file, log_file, env, reader, progress)
        if code == 0 or attempt == PORT_RETRIES or not _port_taken(log_file):
            break
        forget_attempt(job, log_file)
    return read_result(job, code, log_file, started)


def _launch_across(
    job: Job, job_file: Path, log_file: Path, env: dict[str, str], reader: ProgressReader, progress: ProgressSink | None
) -> dict[str, Any]:
    """This node's share of a job spanning nodes: meet the other launchers (same job), run this node's ranks with
    torchrun, post how they ended, and end as every node does (convcheck.engine.rollcall)."""
    nodes = job.nodes
    assert nodes is not None
    meet = meeting(nodes, job.timeout_s)
    launch = meet.next_launch()
    if progress is not None:
        progress({"phase": f"node {nodes.node_rank} of {nodes.nnodes}: waiting for the other nodes"})
    meet.check_in(launch, job.agreed(), job.timeout_s)
    port = meet.torchrun_port(launch, job.timeout_s)
    started = time.monotonic()
    local = nodes.local_ranks(job.layout.world_size)
    try:
        command = torchrun_command(job_file, len(local), nodes, port)
        code = _torchrun(job, job_file, log_file, env, reader, progress, command, meet.watcher(launch))
        end = {"kind": "ok", "result": read_result(job, code, log_file, started, local=local)}
    except BadInput as exc:
        end = {"kind": "bad_input", "error": str(exc)}
    except SetupError as exc:
        end = {"kind": "error", "error": str(exc)}
    except Interrupted as exc:  # the others stop at once instead of waiting for this node's silence
        with contextlib.suppress(SetupError):
            meet.post_end(launch, {"kind": "gone", "error": f"its launcher was {exc}"})
        raise
    meet.post_end(launch, end)
    ends = meet.ends(launch)
    meet.leave(launch)
    return decide(nodes, ends)


PORT_RETRIES = 2
"""Relaunches after a rendezvous port taken between its pick and its bind (EADDRINUSE): torchrun's --standalone and
the warm agent pick a free port, and a launch started in that gap (another test worker, another user) can take it
first."""


def _port_taken(log_file: Path) -> bool:
    """True when the launch failed because its rendezvous port was taken (nothing of the job has run)."""
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return False
    return "EADDRINUSE" in text and "address already in use" in text


def forget_attempt(job: Job, log_file: Path) -> None:
    """Clear what a launch that lost its rendezvous port left (its log, the ranks' error files), so the relaunch is
    read alone."""
    log_file.unlink(missing_ok=True)
    for rank in range(job.layout.world_size):
        job.error_file(rank).unlink(missing_ok=True)
    job.partial_file.unlink(missing_ok=True)


def _torchrun(
    job: Job,
    job_file: Path,
    log_file: Path,
    env: dict[str, str],
    reader: ProgressReader,
    progress: ProgressSink | None,
    command: list[str] | None = None,
    watch: Callable[[], None] | None = None,
) -> int:
    """One torchrun launch of the job's ranks (`command`: this node's share), output in `log_file`; its exit code."""
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(
            command or torchrun_command(job_file, job.layout.world_size),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_start_session,  # noqa: PLW1509 - setsid + parent-death signal, nothing else
        )
        try:
            return _wait(proc, job.timeout_s, reader, progress, watch)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            raise _timed_out(job, log_file) from None
        except BaseException:
            stop_group(proc)
            raise


def _launch_warm(
    socket_path: str,
    job: Job,
    job_file: Path,
    log_file: Path,
    env: dict[str, str],
    reader: ProgressReader,
    progress: ProgressSink | None,
) -> list[tuple[int, int]] | None:
    """The job's ranks forked by the warm server (`convcheck.engine.warm`); None when it cannot take the job."""
    request = {"job_file": str(job_file), "nproc": job.layout.world_size, "env": env, "log_file": str(log_file),
               "cwd": os.getcwd()}  # fmt: skip

    def poll() -> None:
        if progress is not None:
            for event in reader.poll():
                progress(event)

    try:
        return run_warm(socket_path, request, job.timeout_s, poll)
    except WarmTimeout:
        raise _timed_out(job, log_file) from None


def _timed_out(job: Job, log_file: Path) -> SetupError:
    return SetupError(
        f"ranks did not finish within {job.timeout_s:g} s (a rank hung or died); stopped all ranks; log: {log_file}"
    )


def _wait(
    proc: subprocess.Popen[bytes],
    timeout_s: float,
    reader: ProgressReader,
    progress: ProgressSink | None,
    watch: Callable[[], None] | None = None,
) -> int:
    """Wait for torchrun, handing progress events on as they arrive; TimeoutExpired after `timeout_s`. `watch` is
    called meanwhile and may raise (another node of the run ended badly)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return proc.wait(timeout=min(0.25, max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
        finally:
            if progress is not None:
                for event in reader.poll():
                    progress(event)
        if watch is not None:
            watch()
