"""`verify --spec te` end to end: megatron-core's TE layer specs and the bridge's TE mappings, built unmodified on
convcheck's Transformer Engine stand-in, through the real bridge and real gloo collectives. Every default oracle
passes (logits included: the stand-in computes what TE computes), the mapping oracle proves the TE-named parameters,
and a bug planted in the real bridge's mappings under TE's names is caught by name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from convcheck import api
from tests.support.helpers import ROOT, run_cli, run_rank_script

DEFAULT = {"coverage", "roundtrip", "config", "logits", "differential", "elements", "layout", "mapping"}
HOOKS = str(ROOT / "tests" / "support" / "hooks_te.py")


def _rows(res, oracle: str) -> set[str]:  # type: ignore[no-untyped-def]
    return {r["tensor"] for o in res.report["oracles"] if o["name"] == oracle for r in o["tensors"]}


@pytest.mark.ranks
def test_qwen3_tp2_proves_the_te_named_norms_through_the_bridges_te_mapping(tmp_path: Path) -> None:
    res = run_cli("verify", "--model", "tiny:qwen3", "--tp", "2", "--spec", "te", tmp_path=tmp_path)
    assert res.code == 0, res.out + res.err
    assert res.verdicts() == dict.fromkeys(DEFAULT, "pass")
    proven = _rows(res, "mapping")
    for layer in (0, 1):
        assert f"decoder.layers.{layer}.self_attention.linear_qkv.layer_norm_weight" in proven
        assert f"decoder.layers.{layer}.mlp.linear_fc1.layer_norm_weight" in proven
    assert not any("input_layernorm" in n or "pre_mlp_layernorm" in n for n in proven)  # the local spec's names


@pytest.mark.ranks
def test_qwen3_moe_tp2_ep2_builds_te_grouped_experts_and_passes(tmp_path: Path) -> None:
    res = run_cli("verify", "--model", "tiny:qwen3-moe", "--tp", "2", "--ep", "2", "--spec", "te", tmp_path=tmp_path)
    assert res.code == 0, res.out + res.err
    assert res.verdicts() == dict.fromkeys(DEFAULT, "pass")
    experts = {n for n in _rows(res, "mapping") if ".experts." in n}
    assert experts == {
        f"decoder.layers.{layer}.mlp.experts.linear_fc{fc}.weight{e}" for layer in (0, 1) for fc in (1, 2)
        for e in range(8)
    }  # fmt: skip


@pytest.mark.ranks
def test_llama_passes_every_default_oracle() -> None:
    report = api.verify("tiny:llama", spec="te")
    assert {v.name: v.verdict for v in report.oracles} == dict.fromkeys(DEFAULT, "pass")


@pytest.mark.ranks
def test_the_ranks_build_the_stand_in_where_megatron_core_looks_te_up() -> None:
    """megatron-core's own TE spec and TEGroupedMLP on the stand-in classes, TP2 shards, and TE still absent for every
    other path (HAVE_TE False, no transformer_engine module)."""
    got = api.run_in_ranks(f"{HOOKS}:built", "tiny:qwen3-moe", "tp2ep2", spec="te")
    classes = got["classes"]
    assert {k: classes[k] for k in ("self_attention.linear_qkv", "self_attention.core_attention",
                                    "self_attention.linear_proj", "self_attention.q_layernorm", "pre_mlp_layernorm",
                                    "mlp.experts", "mlp.experts.linear_fc1", "mlp.experts.linear_fc2")} == {
        "self_attention.linear_qkv": "TELayerNormColumnParallelLinear",
        "self_attention.core_attention": "TEDotProductAttention",
        "self_attention.linear_proj": "TERowParallelLinear",
        "self_attention.q_layernorm": "RMSNorm",
        "pre_mlp_layernorm": "RMSNorm",
        "mlp.experts": "TEGroupedMLP",
        "mlp.experts.linear_fc1": "TEColumnParallelGroupedLinear",
        "mlp.experts.linear_fc2": "TERowParallelGroupedLinear",
    }  # fmt: skip
    assert got["final_norm"] == "RMSNorm" and classes["input_layernorm"] == "IdentityOp"
    shapes = got["shapes"]  # hidden 32, 4 heads / 2 KV of 8, TP2; 4 local experts of width 16 (EP2)
    assert shapes["self_attention.linear_qkv.weight"] == (32, 32)
    assert shapes["self_attention.linear_qkv.layer_norm_weight"] == (32,)
    assert shapes["self_attention.linear_proj.weight"] == (32, 16)
    assert [n for n in shapes if n.startswith("mlp.experts.")] == [
        f"mlp.experts.linear_fc{fc}.weight{i}" for fc in (1, 2) for i in range(4)
    ]
    assert got["have_te"] is False and got["te_imported"] is False


@pytest.mark.ranks
def test_swapped_norms_under_te_names_are_caught_by_name(tmp_path: Path) -> None:
    """Import and export swapped alike: the export equals the source (roundtrip passes); the mapping oracle names
    both parameters and the logits differ."""
    res = run_cli("verify", "--model", "tiny:qwen3", "--spec", "te", "--oracle", "roundtrip,mapping,logits",
                  "--hook", "convcheck.mutants.te:swap_layer_norm_weights", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out + res.err
    assert res.verdicts() == {"roundtrip": "pass", "mapping": "fail", "logits": "fail"}
    named = {(f["tensor"], f["kind"]) for f in res.findings("mapping")}
    assert ("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", "import-bytes-differ") in named
    assert ("decoder.layers.0.mlp.linear_fc1.layer_norm_weight", "import-bytes-differ") in named
    replay = next(line for line in res.out.splitlines() if line.startswith("replay: "))
    assert "--spec" not in replay  # the TE specs are verify's default: the replay line names only another choice


def _bugs(res) -> set[str]:  # type: ignore[no-untyped-def]
    """The known upstream bugs tagged on the run's findings (one None for a finding none explains)."""
    return {f.get("detail", {}).get("upstream_bug") for f in res.findings()}


@pytest.mark.ranks
def test_deepseek_v3_te_layout_fails_only_on_its_known_bugs(tmp_path: Path) -> None:
    """MLA on the TE spec: the q / kv down projections are TELinear duplicated on every TP rank, which the explicit
    mappings follow (Geometry.te_spec); what fails is the bridge's two known DeepSeek bugs."""
    res = run_cli("verify", "--model", "tiny:deepseek-v3", "--tp", "2", "--ep", "2", "--spec", "te",
                  "--oracle", "coverage,config,logits,mapping", tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out + res.err
    assert res.verdicts() == {"coverage": "fail", "config": "fail", "logits": "pass", "mapping": "fail"}
    assert _bugs(res) == {"deepseek-mtp-aliases-dropped", "deepseek-yarn-dropped"}
    assert "decoder.layers.0.self_attention.linear_kv_down_proj.weight" in _rows(res, "mapping")


@pytest.mark.ranks
def test_moonlight_te_layout_names_the_q_norm_the_bridge_does_not_map(tmp_path: Path) -> None:
    """Without q LoRA megatron-core's TE layout has a fused q norm HF lacks; the bridge leaves it unmapped and its
    import crashes: a real finding of the production layout, named as the known bug it is."""
    res = run_cli("verify", "--model", "tiny:moonlight", "--spec", "te", "--oracle", "coverage", tmp_path=tmp_path)
    assert res.code == 1, res.out + res.err
    unmapped = {(f["tensor"], f["detail"].get("upstream_bug")) for f in res.findings() if f["kind"] == "unmapped"}
    assert unmapped == {
        (f"decoder.layers.{n}.self_attention.linear_q_proj.layer_norm_weight", "mla-q-proj-norm-unmapped")
        for n in range(4)
    }
    assert "known megatron-bridge bug mla-q-proj-norm-unmapped" in res.out


SEQUENCE_PARALLEL_RANK = """
import torch
import torch.distributed as dist
from convcheck import compat

def main():
    compat.install("cpu", "te")
    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank()
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_config import TransformerConfig
    from convcheck.kernels.te import TELayerNormColumnParallelLinear, TERowParallelLinear
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    gen = torch.Generator().manual_seed(0)
    w1, b1, w2, b2 = (torch.randn(*s, generator=gen) for s in ((32, 16), (32,), (16, 32), (16,)))
    gamma, x = torch.randn(16, generator=gen), torch.randn(8, 2, 16, generator=gen)  # [s, b, h]
    outs = {}
    for sp in (True, False):
        config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4, ffn_hidden_size=32,
                                   tensor_model_parallel_size=2, sequence_parallel=sp, use_cpu_initialization=True,
                                   params_dtype=torch.float32, normalization="RMSNorm", perform_initialization=False)
        fc1 = TELayerNormColumnParallelLinear(16, 32, config=config, init_method=None, gather_output=False, bias=True,
                                              skip_bias_add=False, is_expert=False)
        fc2 = TERowParallelLinear(32, 16, config=config, init_method=None, bias=True, input_is_parallel=True,
                                  skip_bias_add=False, is_expert=False)
        assert (fc1.layer_norm_weight.sequence_parallel, fc2.bias.sequence_parallel) == (sp, sp)
        with torch.no_grad():
            fc1.layer_norm_weight.copy_(gamma)
            fc1.weight.copy_(w1[rank * 16:(rank + 1) * 16]); fc1.bias.copy_(b1[rank * 16:(rank + 1) * 16])
            fc2.weight.copy_(w2[:, rank * 16:(rank + 1) * 16]); fc2.bias.copy_(b2)
            inp = x[rank * 4:(rank + 1) * 4] if sp else x  # a sequence-parallel layer gets its [s / tp] rows
            out = fc2(fc1(inp)[0])[0]
        assert out.shape == (4 if sp else 8, 2, 16), out.shape
        if sp:
            parts = [torch.empty_like(out) for _ in range(2)]
            dist.all_gather(parts, out)
            out = torch.cat(parts)
        outs[sp] = out
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.layernorm_epsilon) * gamma
    want = torch.nn.functional.linear(torch.nn.functional.linear(normed, w1, b1), w2, b2)
    assert torch.equal(outs[True].view(torch.int32), outs[False].view(torch.int32))
    err = float((outs[True] - want).abs().max())
    assert err < 1e-4, err  # fp32 sums in another order
    if rank == 0:
        print("ok", err, flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


@pytest.mark.ranks
def test_sequence_parallel_linears_gather_and_scatter_along_the_sequence(tmp_path: Path) -> None:
    """TP2 over gloo, TE's sequence parallelism on the stand-in: LayerNormLinear (column) norms its [s / tp] rows
    and all-gathers them, the row-parallel linear reduce-scatters its output along the sequence; the gathered
    output is bitwise the one without sequence parallelism, within 1e-4 of the plain-torch MLP, and the norm weight
    and row bias carry `sequence_parallel`."""
    script = tmp_path / "sp.py"
    script.write_text(SEQUENCE_PARALLEL_RANK)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = run_rank_script(script, [], 2, env, tmp_path, timeout=300)  # the warm server's ranks, else torchrun
    assert any(line.startswith("ok ") for line in log.splitlines()), log[-3000:]
