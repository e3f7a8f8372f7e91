"""distckpt oracle: a torch_dist checkpoint saved at one layout resumes at another, bitwise; planted bugs are named.

Each layout pair costs a save launch and a resume launch; repeating --resume-layout resumes one save at several
layouts, so the pairs TP1<->TP2, EP1<->EP2, PP1<->PP2 and TP2xEP2 -> TP1 share launches.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from convcheck import compat
from tests.support.helpers import mutant, processes_holding, run_cli


def test_shim11_still_needed_checkpoint_preload_synchronizes_cuda() -> None:
    """Fails when the torch_dist save stops calling torch.cuda.synchronize() while staging (then delete shim 11)."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    method = compat.upstream(FileSystemWriterAsync.__dict__["preload_tensors"])
    assert "torch.cuda.synchronize()" in inspect.getsource(method.__func__)


def test_shim12_still_needed_checkpoint_finalize_flag_on_cuda() -> None:
    """Fails when the save's finalize stops making its failure flag on CUDA (then delete shim 12)."""
    from megatron.core.dist_checkpointing.strategies import state_dict_saver

    method = compat.upstream(state_dict_saver.save_state_dict_async_finalize)
    assert "device=torch.cuda.current_device()" in inspect.getsource(method)


def test_shim11_follows_the_requested_device() -> None:
    """On a CPU run the staging makes no CUDA call; on a CUDA run (shim inactive) upstream runs unchanged."""
    import torch
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    from convcheck.compat import no_cuda

    compat.install("cpu")
    try:
        assert FileSystemWriterAsync.preload_tensors([], True) == []
        no_cuda.set_active(False)
        if not torch.cuda.is_available():
            with pytest.raises(RuntimeError):  # upstream's torch.cuda.synchronize() without a driver
                FileSystemWriterAsync.preload_tensors([], True)
    finally:
        no_cuda.set_active(True)


def test_optimizer_part_still_cuda_only() -> None:
    """Fails when megatron-core's DDP / distributed optimizer no longer need CUDA (then run the optimizer part on
    CPU)."""
    from megatron.core.distributed import param_and_grad_buffer
    from megatron.core.optimizer import distrib_optimizer, optimizer

    from convcheck.ckpt.optimizer import CPU_BLOCKERS

    assert "device=torch.cuda.current_device()" in inspect.getsource(param_and_grad_buffer._ParamAndGradBuffer)
    assert "device='cuda'" in inspect.getsource(optimizer.MixedPrecisionOptimizer.__init__)
    assert "'torch.cuda.BFloat16Tensor'" in inspect.getsource(distrib_optimizer.DistributedOptimizer)
    assert len(CPU_BLOCKERS) == 3


# --- without ranks -------------------------------------------------------------------------------------------------


def test_distckpt_is_opt_in() -> None:
    from convcheck.oracles import DEFAULT_ORACLES, ORACLES, parse_oracle_names

    assert "distckpt" in ORACLES and not ORACLES["distckpt"].default
    assert "distckpt" not in DEFAULT_ORACLES and parse_oracle_names("") == DEFAULT_ORACLES
    assert parse_oracle_names("distckpt,roundtrip") == ("distckpt", "roundtrip")


@pytest.mark.parametrize(
    ("model", "kwargs", "message"),
    [
        ("tiny:qwen3", {"resume_layout": "tp2"}, "--resume-layout is used only by the distckpt oracle"),
        ("tiny:qwen3", {"oracles": "distckpt", "resume_layout": "tp3"}, "impossible layout TP3"),
        ("tiny:qwen3", {"oracles": "distckpt", "resume_layout": ["tp1", "ep2"]}, "the model has no experts"),
        (
            "tiny:qwen3-moe",
            {"oracles": "distckpt", "experts": "te-grouped", "spec": "local"},
            "te-grouped has no sharded state dict",
        ),
    ],
)
def test_bad_resume_layout_is_bad_input(model: str, kwargs: dict, message: str) -> None:
    from convcheck import api
    from convcheck.errors import BadInput

    with pytest.raises(BadInput, match=message):
        api.prepare(model, device="cpu", **kwargs)


def test_resume_layouts_default_to_tp1() -> None:
    from convcheck import api
    from convcheck.layout import ParallelLayout

    job = api.prepare("tiny:qwen3", "tp2", oracles="distckpt", device="cpu")
    assert job.resume_layouts == (ParallelLayout(),)
    job = api.prepare("tiny:qwen3", oracles="distckpt", device="cpu", resume_layout=["pp2", "tp2", "pp2"])
    assert job.resume_layouts == (ParallelLayout(pp=2), ParallelLayout(tp=2))
    assert api.prepare("tiny:qwen3", device="cpu").resume_layouts == ()


def test_bad_resume_layout_cli_is_one_line() -> None:
    r = run_cli("verify", "--model", "tiny:qwen3", "--oracle", "distckpt", "--resume-layout", "tp2q")
    assert r.code == 2 and "is not of the form" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_merge_folds_phases_into_one_verdict() -> None:
    from convcheck.engine.resume import merge
    from convcheck.verdict import Finding, OracleVerdict, TensorRow

    row = TensorRow(tensor="a", shape=(2,), dtype="bfloat16", verdict="pass")
    saved = OracleVerdict(name="distckpt", checked=2, rows=(row,), metrics={"saved_at": "TP2", "optimizer": "x"})
    bad = Finding(tensor="a", kind="bytes-differ", message="resumed at TP1: differs")
    resumed = OracleVerdict(
        name="distckpt",
        checked=2,
        findings=(bad,),
        rows=(TensorRow(tensor="a", shape=(2,), dtype="bfloat16", verdict="fail"),),
        metrics={"resumed_at": "TP1", "optimizer": "x", "load_s": 0.1},
    )
    merged = merge(saved, [resumed])
    assert merged.verdict == "fail" and merged.findings == (bad,) and merged.checked == 4
    assert merged.rows[0].verdict == "fail"
    assert merged.metrics == {"saved_at": "TP2", "optimizer": "x", "load_s": 0.1, "resumed_at": "TP1"}
    assert merge(saved, []).verdict == "fail"  # nothing resumed: nothing proven


# --- with ranks: one save resumed at several layouts ----------------------------------------------------------------


def _verify(tmp: Path, model: str, layout: tuple[str, ...], resumes: tuple[str, ...], *hook: str):  # type: ignore[no-untyped-def]
    args = [a for r in resumes for a in ("--resume-layout", r)]
    hooks = ["--hook", hook[0]] if hook else []
    timeout = 300 * (1 + len(resumes))  # one launch per layout; generous on a shared 2-core machine
    return run_cli(
        "verify", "--model", model, *layout, "--oracle", "distckpt", *args, *hooks, tmp_path=tmp, timeout=timeout
    )


@pytest.mark.ranks
def test_tp1_checkpoint_resumes_at_tp2_ep2_and_pp2(tmp_path: Path) -> None:
    """TP1 -> TP2, EP1 -> EP2 and PP1 -> PP2 from one save (tiny:qwen3-moe: attention, dense norms, 8 experts)."""
    r = _verify(tmp_path, "tiny:qwen3-moe", (), ("tp2", "ep2", "pp2"))
    assert r.code == 0, (r.err, r.findings())
    (verdict,) = r.report["oracles"]
    tensors = len(verdict["tensors"])
    assert verdict["verdict"] == "pass" and verdict["checked"] == 4 * tensors == 4 * 69
    metrics = verdict["metrics"]
    assert metrics["saved_at"] == "TP1" and metrics["resumed_at"] == "TP2,EP2,PP2"
    assert metrics["restored_keys@EP2"] == metrics["sharded_keys"] > 0
    assert metrics["optimizer"].startswith("not run on CPU") and "distrib_optimizer.py:401" in metrics["optimizer"]


@pytest.mark.ranks
def test_tp2ep2_checkpoint_resumes_at_tp1(tmp_path: Path) -> None:
    """TP2xEP2 -> TP1 (so TP2 -> TP1 and EP2 -> EP1 at once), world size 2 -> 1; the save's multiprocessing workers
    do not outlive the ranks (they once did: a rank's os._exit skipped multiprocessing's atexit), and a log folder
    too deep for a socket path under it does not break the save (it once failed with EOFError)."""
    logs = tmp_path / ("deep-" * 12) / "logs"
    r = _verify(tmp_path, "tiny:qwen3-moe", ("--tp", "2", "--ep", "2", "--log-dir", str(logs)), ("tp1",))
    assert r.code == 0, (r.err, r.findings())
    assert processes_holding(logs) == []
    metrics = r.report["oracles"][0]["metrics"]
    assert metrics["saved_at"] == "TP2xEP2" and metrics["resumed_at"] == "TP1"


@pytest.mark.ranks
def test_key_dropped_on_restore_is_named(tmp_path: Path) -> None:
    """Planted: a TP2 checkpoint restored at TP1 without one sharded key: the key, the parameter left at the sentinel
    and the HF tensor whose export differs are each named."""
    r = _verify(tmp_path, "tiny:qwen3", ("--tp", "2"), ("tp1",), mutant("checkpoint", "drop_key_on_restore"))
    assert r.code == 1, r.err
    found = {(f["tensor"], f["kind"]) for f in r.findings("distckpt")}
    assert ("decoder.final_layernorm.weight", "not-restored") in found
    assert ("decoder.final_layernorm.weight", "sentinel") in found
    assert ("model.norm.weight", "bytes-differ") in found
    assert all("resumed at TP1" in f["message"] for f in r.findings("distckpt")), r.findings()
    assert "--resume-layout tp1" in r.out and "--oracle distckpt" in r.out  # the replay line


def test_shim13_still_needed_reshardable_load_leaves_out_step() -> None:
    """Fails when the fully_reshardable loader hands `step` on, or the copy stops requiring it (then delete shim 13)."""
    from megatron.core.optimizer import distrib_optimizer

    cls = distrib_optimizer.DistributedOptimizer
    loader = inspect.getsource(cls.load_parameter_state_from_fully_reshardable)
    copy = inspect.getsource(compat.upstream(cls._set_main_param_and_optimizer_states))
    assert 'if k == "step":' in loader and "continue" in loader.split('if k == "step":', 1)[1][:200]
    assert "dst_tensors[key].copy_(tensors[key])" in copy and "key not in tensors" not in copy


def test_shim13_copies_main_param_and_moments_without_step() -> None:
    """Upstream's copy over a real torch Adam: KeyError 'step' without the shim; with it every tensor but `step`."""
    import types

    import torch
    from megatron.core.optimizer import distrib_optimizer

    from convcheck.compat.no_te import install_torch_adam_step

    install_torch_adam_step()
    if distrib_optimizer.HAVE_APEX_OR_TE:
        pytest.skip("Apex or TE is installed: megatron-core uses its fused Adam and shim 13 stays out")
    main = torch.nn.Parameter(torch.zeros(4))
    adam = torch.optim.Adam([main])
    main.grad = torch.ones(4)
    adam.step()
    owner = types.SimpleNamespace(
        model_param_group_index_map={"w": (0, 0)},
        config=types.SimpleNamespace(use_precision_aware_optimizer_no_fp8_or_ds_fp8=False),
        optimizer=adam,
    )
    loaded = {"param": torch.full((4,), 2.0), "exp_avg": torch.full((4,), 3.0), "exp_avg_sq": torch.full((4,), 4.0)}
    cls = distrib_optimizer.DistributedOptimizer
    step = adam.state[main]["step"].clone()
    with torch.no_grad():  # as upstream's load_state_dict runs it
        with pytest.raises(KeyError, match="step"):
            compat.upstream(cls._set_main_param_and_optimizer_states)(owner, "w", loaded)
        cls._set_main_param_and_optimizer_states(owner, "w", loaded)
    state = adam.state[main]
    assert main.detach().tolist() == [2.0] * 4
    assert state["exp_avg"].tolist() == [3.0] * 4 and state["exp_avg_sq"].tolist() == [4.0] * 4
    assert torch.equal(state["step"].view(torch.int32), step.view(torch.int32))  # bitwise
