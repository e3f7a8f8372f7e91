"""`--from-config`: a published config.json shrunk to a tiny random model of the same architecture (issue #34).

The shrinker's rules as pure functions, every structural knob of four published configs kept through the real
transformers classes, distinct widths, determinism, refusals (one stderr line, exit 2), and one multi-rank run: the
shrunk DeepSeek-V3 through the real bridge at TP2xEP2 names the same two real bridge bugs as tiny:deepseek-v3.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from convcheck import api
from convcheck.cli.main import PREPARE_OPTIONS, job_from_options, replay_line, verify
from convcheck.compare.bits import int_view
from convcheck.errors import BadInput
from convcheck.fixtures.from_config import build_from_config, class_fields, config_key, read_config, shrink_file
from convcheck.fixtures.reference import folder_digests
from convcheck.fixtures.shrink import ClassFields, shrink_config
from convcheck.fixtures.shrink_rules import Routing, cut_pattern, shrink_heads, shrink_routing
from convcheck.hf.checkpoint import open_checkpoint
from convcheck.hf.geometry import Geometry
from convcheck.layout import ParallelLayout
from convcheck.models.fixture_spec import POOL_SIZE
from tests.support.helpers import ROOT, mutant, run_cli

DATA = ROOT / "tests" / "data"
PUBLISHED = ("deepseek-v3", "moonlight-16b-a3b", "qwen3-30b-a3b", "llama-3.1-8b", "mistral-7b-v0.1", "kimi-k2-instruct")
DSV3 = "config:tests/data/deepseek-v3.config.json"


def _published(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.config.json").read_text())


# ---- the pure rules ------------------------------------------------------------------------------------------------


def test_a_layer_pattern_keeps_one_layer_per_run_around_its_repeating_part() -> None:
    dense, moe = "dense", "moe"
    assert cut_pattern([dense] * 3 + [moe] * 58) == [dense, moe, moe, moe]  # DeepSeek-V3: 3 dense-first
    assert cut_pattern([dense] * 3 + [moe] * 58, 6) == [dense] + [moe] * 5
    assert cut_pattern([moe] * 48) == [moe, moe]
    assert cut_pattern([dense, moe] * 24) == [dense, moe, dense, moe]  # decoder_sparse_step 2
    assert cut_pattern([dense, moe] * 24, 5) == [dense, moe, dense, moe, dense]
    assert cut_pattern([dense] + [moe] * 46 + [dense]) == [dense, moe, moe, dense]  # mlp_only_layers [0, 47]
    full, sliding = "dense", "dense+sliding_attention"
    assert cut_pattern([full] * 28 + [sliding] * 8) == [full, full, full, sliding]  # the longest stretch repeats
    with pytest.raises(BadInput) as info:
        cut_pattern([dense] * 3 + [moe] * 58, 1)
    assert str(info.value) == (
        "--layers 1 cannot keep the layer pattern (dense x3, moe x58): it needs at least 2 (dense x1, moe x1)"
    )


def test_heads_keep_their_ratio_and_routing_keeps_the_experts_a_group_is_scored_by() -> None:
    assert shrink_heads(128, 128) == (4, 4)  # multi-head (MLA)
    assert shrink_heads(32, 8) == (8, 2)
    assert shrink_heads(32, 4) == (16, 2)
    assert shrink_heads(28, 4) == (14, 2)
    assert shrink_heads(8, 1) == (8, 1)  # multi-query kept
    with pytest.raises(BadInput, match=r"^num_attention_heads=32 is not a multiple of num_key_value_heads=5$"):
        shrink_heads(32, 5)
    # DeepSeek-V3: 8 groups, top 4 groups, top-8 -> 2 experts score a group, kept (GROUPED_ROUTING)
    assert shrink_routing(256, 8, 8, 4) == Routing(experts=8, top_k=4, groups=4, top_groups=2)
    assert shrink_routing(160, 6, 8, 3) == Routing(experts=8, top_k=4, groups=4, top_groups=2)  # DeepSeek-V2
    assert shrink_routing(64, 6, 1, 1) == Routing(experts=8, top_k=4, groups=1, top_groups=1)  # Moonlight
    assert shrink_routing(128, 8) == Routing(experts=8, top_k=4, groups=None, top_groups=None)
    assert shrink_routing(128, 1) == Routing(experts=8, top_k=1, groups=None, top_groups=None)
    with pytest.raises(BadInput, match=r"^num_experts_per_tok=7 is not a multiple of topk_group=2 "):
        shrink_routing(256, 7, 8, 2)


# ---- the published configs -----------------------------------------------------------------------------------------


def _rope(c: dict[str, Any]) -> dict[str, Any]:
    """Rope settings however spelt (rope_scaling + rope_theta, or transformers 5's rope_parameters)."""
    rope = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    if "type" in rope:
        rope.setdefault("rope_type", rope.pop("type"))
    rope.setdefault("rope_theta", c.get("rope_theta"))
    rope.setdefault("rope_type", "default")
    return rope


def _knobs(c: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """Every structural knob of a config (class defaults where it is silent), widths left out."""
    c = {**defaults, **c}
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
    layers = c["num_hidden_layers"]
    if "kv_lora_rank" in c:
        moe = [i >= c["first_k_dense_replace"] for i in range(layers)]
    elif "decoder_sparse_step" in c:
        dense = set(c.get("mlp_only_layers") or [])
        moe = [i not in dense and (i + 1) % c["decoder_sparse_step"] == 0 for i in range(layers)]
    else:
        moe = [False] * layers
    pattern = [kind for i, kind in enumerate(moe) if i == 0 or moe[i - 1] != kind]
    grouped = (c.get("n_group") or 1) > 1
    names = ("attention_bias", "mlp_bias", "hidden_act", "rms_norm_eps", "tie_word_embeddings", "norm_topk_prob",
             "routed_scaling_factor", "rope_interleave", "n_shared_experts", "num_nextn_predict_layers",
             "use_sliding_window", "router_aux_loss_coef")  # fmt: skip
    return {
        "mla": "kv_lora_rank" in c,
        "q_lora": c.get("q_lora_rank") is not None,
        "heads_per_kv_head": heads // kv,
        "head_dim_is_hidden_over_heads": c.get("head_dim") in (None, c["hidden_size"] // heads),
        "moe_pattern": pattern,
        "grouped_routing": grouped,
        "experts_scoring_a_group": c["num_experts_per_tok"] // c["topk_group"] if grouped else None,
        "rope": _rope(c),
        **{name: c.get(name) for name in names},
    }


@pytest.mark.parametrize("name", PUBLISHED)
def test_the_shrunk_model_keeps_every_knob_of_the_published_config(name: str) -> None:
    """Compared as transformers reads both: the published config.json and the one the fixture holds."""
    source = _published(name)
    folder, shrunk = build_from_config(DATA / f"{name}.config.json")
    built = json.loads((folder / "config.json").read_text())
    defaults = class_fields(shrunk.spec.config_class).own
    source = {**source, "model_type": built["model_type"]}  # kimi_k2: DeepseekV3Config's config under its own name
    assert _knobs(built, defaults) == _knobs(source, defaults)
    assert built["architectures"] == source["architectures"]
    assert shrunk.spec.mtp_layers == source.get("num_nextn_predict_layers", 0)


@pytest.mark.parametrize("name", PUBLISHED)
def test_the_shrunk_model_is_small_sharded_distinct_and_splits_at_tp2_ep2_etp2_pp2(name: str) -> None:
    folder, shrunk = build_from_config(DATA / f"{name}.config.json")
    ckpt = open_checkpoint(folder)
    assert len(set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values())) >= 2
    fp32 = shrunk.spec.fp32_tensors
    for tname, entry in ckpt.tensors.items():
        with safe_open(str(folder / entry.file), "pt") as fh:
            t = fh.get_tensor(tname)
        assert t.dtype == (torch.float32 if fp32 and tname.endswith(fp32) else torch.bfloat16), tname
        assert t.numel() <= POOL_SIZE, tname
        assert int_view(t).unique().numel() == t.numel(), f"{tname} has repeated values"
    geometry = Geometry.from_hf_config(ckpt.config)
    moe = geometry.num_experts > 0
    assert ParallelLayout(tp=2, pp=2, ep=2 if moe else 1, etp=2 if moe else 1).problems_for(geometry) == []


QWEN2_SLIDING = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20, "hidden_act": "silu",
}  # fmt: skip
"""A Qwen2-7B shape with its sliding window switched on from layer 20 (7 query heads per KV head)."""


def _pattern(c: dict[str, Any]) -> list[str]:
    """Per-layer kinds of a qwen2 / qwen3_moe config as transformers builds them (MoE or dense, sliding or full)."""
    layers = c["num_hidden_layers"]
    if c["model_type"] == "qwen3_moe":
        step, dense = c.get("decoder_sparse_step", 1), set(c.get("mlp_only_layers") or [])
        return ["moe" if i not in dense and (i + 1) % step == 0 else "dense" for i in range(layers)]
    types = c.get("layer_types")
    return types or ["sliding_attention" if i >= c["max_window_layers"] else "full_attention" for i in range(layers)]


@pytest.mark.parametrize("name", ["qwen2-sliding", "qwen3-moe-step2"])
def test_a_layer_pattern_is_cut_and_written_back_in_the_familys_own_knobs(name: str, tmp_path: Path) -> None:
    from convcheck.fixtures.shrink_rules import collapse, decompose

    source = (
        QWEN2_SLIDING if name == "qwen2-sliding"
        else {**_published("qwen3-30b-a3b"), "decoder_sparse_step": 2, "mlp_only_layers": [0, 47]}
    )  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(source))
    folder, shrunk = build_from_config(tmp_path / "config.json")
    built = json.loads((folder / "config.json").read_text())
    before, after = decompose(_pattern(source)), decompose(_pattern(built))
    assert (collapse(after.head), after.period, collapse(after.trailer)) == (
        collapse(before.head), before.period, collapse(before.trailer)
    )  # fmt: skip
    expected = {
        "qwen2-sliding": {"num_hidden_layers": 4, "max_window_layers": 3, "layer_types": ["full_attention"] * 3
                          + ["sliding_attention"], "hidden_size": 56, "num_attention_heads": 14, "vocab_size": 88},
        "qwen3-moe-step2": {"num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [5]},
    }[name]  # fmt: skip
    assert {key: built[key] for key in expected} == expected
    note = {
        "qwen2-sliding": "num_hidden_layers 28 -> 4: dense x20, dense+sliding_attention x8 -> dense x3, "
        "dense+sliding_attention x1",
        "qwen3-moe-step2": "num_hidden_layers 48 -> 6: dense x1, moe x1, dense x1, ",
    }[name]
    assert note in " ".join(shrunk.notes)


def test_widths_that_a_swap_could_hide_behind_differ() -> None:
    for name in PUBLISHED:
        c = shrink_file(DATA / f"{name}.config.json").spec.config
        keys = ["hidden_size", "intermediate_size", "vocab_size"]
        keys += ["moe_intermediate_size"] if "moe_intermediate_size" in c else []
        if "kv_lora_rank" in c:
            keys += ["kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"]
            keys += ["q_lora_rank"] if c["q_lora_rank"] is not None else []
        widths = [c[key] for key in keys]
        assert len(set(widths)) == len(widths), (name, dict(zip(keys, widths, strict=True)))


def test_the_deepseek_v3_config_shrinks_to_exactly_this() -> None:
    """61 layers (3 dense-first, 58 MoE), 256 experts in 8 groups (top 4), top-8, yarn x40, one MTP layer: what is
    kept, what is cut, and what is left out, with the reason given for each."""
    shrunk = shrink_file(DATA / "deepseek-v3.config.json")
    assert shrunk.spec.config == {
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
        "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
        "intermediate_size": 64, "kv_lora_rank": 16, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
        "moe_intermediate_size": 20, "n_group": 4, "n_routed_experts": 8, "n_shared_experts": 1,
        "norm_topk_prob": True, "num_attention_heads": 4, "num_experts_per_tok": 4, "num_hidden_layers": 4,
        "num_key_value_heads": 4, "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 24,
        "qk_nope_head_dim": 12, "qk_rope_head_dim": 8, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "tie_word_embeddings": False, "topk_group": 2,
        "torch_dtype": "bfloat16", "use_cache": True, "v_head_dim": 10, "vocab_size": 152,
    }  # fmt: skip
    assert (shrunk.spec.config_class, shrunk.spec.mtp_layers) == ("DeepseekV3Config", 1)
    assert shrunk.spec.fp32_tensors == ("e_score_correction_bias",)
    assert "num_hidden_layers 61 -> 4: dense x3, moe x58 -> dense x1, moe x3" in shrunk.notes
    dropped = sorted(note.split()[1].split("=")[0] for note in shrunk.notes if note.startswith("dropped "))
    assert dropped == ["architectures", "auto_map", "aux_loss_alpha", "ep_size", "moe_layer_freq",
                       "quantization_config", "scoring_func", "seq_aux", "topk_method", "torch_dtype",
                       "transformers_version"]  # fmt: skip


def test_the_build_is_deterministic_and_cached_by_content(tmp_path: Path) -> None:
    path = DATA / "deepseek-v3.config.json"
    cached, shrunk = build_from_config(path)
    again, _ = build_from_config(path)
    assert again == cached and (cached / ".complete").read_text().strip() == config_key(shrunk.spec)
    fresh, _ = build_from_config(path, out=tmp_path / "fresh")
    assert folder_digests(fresh) == folder_digests(cached)
    assert config_key(shrink_file(path).spec) == config_key(shrunk.spec)
    assert config_key(shrink_file(path, layers=6).spec) != config_key(shrunk.spec)


# ---- refusals ------------------------------------------------------------------------------------------------------


def _refusal(config: dict[str, Any], fields: ClassFields | None = None, layers: int | None = None) -> str:
    family = {"deepseek_v3": "DeepseekV3Config", "llama": "LlamaConfig"}.get(config.get("model_type", ""))
    fields = fields or (class_fields(family) if family else ClassFields(own={}, base=frozenset()))
    with pytest.raises(BadInput) as info:
        shrink_config(config, fields, name="x", layers=layers)
    return str(info.value)


def test_what_cannot_be_shrunk_is_refused_in_one_line_naming_it() -> None:
    dsv3, llama = _published("deepseek-v3"), _published("llama-3.1-8b")
    supported = (
        "deepseek_v3, gemma3_text, gemma4_text, glm4_moe, glm4_moe_lite, glm_moe_dsa, gpt_oss, llama, minimax_m2, "
        "mistral, nemotron_h, olmoe, qwen2, qwen3, qwen3_5_moe_text, qwen3_5_text, qwen3_moe, qwen3_next"
    )
    assert (
        _refusal({"model_type": "gemma2"})
        == f"--from-config cannot shrink model_type 'gemma2'; it supports {supported}"
    )
    assert _refusal({}) == f"the config has no model_type (--from-config supports {supported})"
    assert _refusal({**llama, "architectures": ["LlamaForSequenceClassification"]}) == (
        "architectures ['LlamaForSequenceClassification'] is not LlamaForCausalLM, what model_type llama builds"
    )
    assert _refusal({**dsv3, "scoring_func": "softmax"}) == (
        "scoring_func='softmax' cannot be kept: DeepseekV3Config (which builds the fixture) assumes 'sigmoid'"
    )
    assert _refusal({**dsv3, "moe_layer_freq": 2}) == (
        "moe_layer_freq=2 cannot be kept: DeepseekV3Config (which builds the fixture) assumes 1"
    )
    assert _refusal({**dsv3, "qk_head_dim": 128}) == (
        "qk_head_dim=128 disagrees with what DeepseekV3Config derives from the other fields"
    )
    assert _refusal({**dsv3, "num_experts_per_tok": 7}).startswith("num_experts_per_tok=7 is not a multiple of")
    assert _refusal(dsv3, layers=1).startswith("--layers 1 cannot keep the layer pattern (dense x3, moe x58)")
    fields = class_fields("LlamaConfig")
    unknown = ClassFields(own={**fields.own, "attention_chunk": 0}, base=fields.base)
    assert _refusal({**llama, "attention_chunk": 8192}, unknown) == (
        "the shrinker does not know how to shrink attention_chunk=8192 (LlamaConfig fields that may shape the model; "
        "their default values would be kept)"
    )


def test_a_field_transformers_does_not_read_is_kept_and_said_so() -> None:
    shrunk = shrink_config({**_published("llama-3.1-8b"), "my_note": "x"}, class_fields("LlamaConfig"), name="x")
    assert shrunk.spec.config["my_note"] == "x"
    assert "kept my_note='x' as given (LlamaConfig does not read it)" in shrunk.notes


def test_an_unreadable_config_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "list.json").write_text("[]")
    for name, message in (
        ("missing.json", f"config file not found: {tmp_path / 'missing.json'}"),
        ("bad.json", f"{tmp_path / 'bad.json'} is not JSON: Expecting property name enclosed in double quotes at "
                     "line 1 column 2"),
        ("list.json", f"{tmp_path / 'list.json'} holds a JSON list, not a config object"),
    ):  # fmt: skip
        with pytest.raises(BadInput) as info:
            read_config(tmp_path / name)
        assert str(info.value) == message


def test_bad_input_exits_2_with_one_stderr_line(tmp_path: Path) -> None:
    gemma = tmp_path / "gemma.json"
    gemma.write_text(json.dumps({"model_type": "gemma2"}))
    cases = {
        ("fixtures", "build", "--from-config", str(tmp_path / "missing.json")): "config file not found: ",
        ("fixtures", "build", "--from-config", str(gemma)): "cannot shrink model_type 'gemma2'",
        ("fixtures", "build"): "give a fixture NAME or --from-config FILE",
        ("verify", "--model", f"config:{gemma}"): "cannot shrink model_type 'gemma2'",
        ("verify", "--model", "tiny:qwen3", "--layers", "2"): "--layers applies only to a --model config:FILE fixture",
    }
    for args, message in cases.items():
        res = run_cli(*args)
        lines = res.err.strip().splitlines()
        assert res.code == 2 and len(lines) == 1 and message in lines[0], (args, res.code, res.err)
        assert lines[0].startswith("convcheck: error: ")


@pytest.mark.fresh_process
def test_fixtures_build_prints_what_it_shrank_and_its_folder_last() -> None:
    """A fresh Python that imports transformers to read the config class (~20 s on 2 busy cores)."""
    res = run_cli("fixtures", "build", "--from-config", str(DATA / "llama-3.1-8b.config.json"))
    assert res.code == 0, res.err
    [folder] = res.out.strip().splitlines()
    assert Path(folder) == build_from_config(DATA / "llama-3.1-8b.config.json")[0]
    assert "shrunk: num_hidden_layers 32 -> 2: dense x32 -> dense x2" in res.err.splitlines()
    assert open_checkpoint(folder).architecture == "LlamaForCausalLM"


def test_the_replay_line_of_a_config_model_keeps_its_layers() -> None:
    job = api.prepare("config:tests/data/llama-3.1-8b.config.json", "tp2", layers=4, oracles="roundtrip")
    line = replay_line(job, job.oracles)
    assert (
        line
        == "convcheck verify --model config:tests/data/llama-3.1-8b.config.json --layers 4 --tp 2 --oracle roundtrip"
    )
    params = verify.make_context("verify", shlex.split(line)[2:]).params
    assert job_from_options({k: params[k] for k in PREPARE_OPTIONS}) == job


# ---- what the published configs showed: two convcheck false alarms, fixed -----------------------------------------


def _failing(table: tuple[Any, ...], name: str, megatron: dict[str, Any], **hf: Any) -> set[str]:
    """Labels of the rules of `table` on the Megatron fields given that fail for the shrunk `name` config (+ `hf`)."""
    from convcheck.oracles.config import check_rule, flatten

    view = {**flatten(json.loads((build_from_config(DATA / f"{name}.config.json")[0] / "config.json").read_text()))}
    return {
        f.tensor for rule in table if rule.megatron in megatron
        for f in [check_rule(rule, {**view, **hf}, megatron.get)] if f is not None
    }  # fmt: skip


def test_llama3_rope_scaling_is_a_rule_not_a_false_alarm() -> None:
    """megatron-bridge keeps Llama-3 frequency scaling (llama_bridge.py:79-81: rope_scaling, rope_scaling_factor);
    megatron-core fixes its low / high frequency factors and original length (rotary_pos_embedding.py:84,96-98)."""
    from convcheck.models.dense import LLAMA_TABLE

    right = {"position_embedding_type": "rope", "seq_len_interpolation_factor": None, "rope_scaling": True,
             "rope_scaling_factor": 8.0}  # fmt: skip
    assert _failing(LLAMA_TABLE, "llama-3.1-8b", right) == set()
    rope = "rope_parameters.rope_type -> position_embedding_type"
    assert _failing(LLAMA_TABLE, "llama-3.1-8b", {**right, "rope_scaling_factor": 4.0}) == {rope}
    assert _failing(LLAMA_TABLE, "llama-3.1-8b", {**right, "rope_scaling": False}) == {
        rope,
        "<implied> -> rope_scaling",
    }
    assert _failing(LLAMA_TABLE, "llama-3.1-8b", right, **{"rope_parameters.high_freq_factor": 2.0}) == {
        "<implied> -> rope_scaling"
    }
    assert _failing(LLAMA_TABLE, "qwen3-30b-a3b", {**right, "rope_scaling": False}) == set()
    assert _failing(LLAMA_TABLE, "qwen3-30b-a3b", right) == {rope, "<implied> -> rope_scaling"}


def test_an_mla_model_without_rope_scaling_reads_megatrons_yarn_x1_as_plain_rope() -> None:
    """megatron-bridge leaves MLA's rope_type yarn and sets rotary_scaling_factor 1 where HF has no scaling
    (conversion/model_bridge.py:604-613): the same function as plain RoPE (the logits oracle agrees); Megatron's own
    default factor 40 there is a real bug, still named."""
    from convcheck.models.deepseek import DEEPSEEK_V3_TABLE

    yarn = {"rope_type": "yarn", "rotary_scaling_factor": 1.0}
    assert _failing(DEEPSEEK_V3_TABLE, "moonlight-16b-a3b", yarn) == set()
    assert _failing(DEEPSEEK_V3_TABLE, "moonlight-16b-a3b", {**yarn, "rotary_scaling_factor": 40.0}) == {
        "rope_parameters.rope_type -> rope_type"
    }
    assert _failing(DEEPSEEK_V3_TABLE, "deepseek-v3", {**yarn, "rotary_scaling_factor": 40.0}) == set()
    assert _failing(DEEPSEEK_V3_TABLE, "deepseek-v3", yarn) == {
        "rope_parameters.rope_type -> rope_type", "rope_parameters.factor -> rotary_scaling_factor"
    }  # fmt: skip


# ---- through the real bridge ---------------------------------------------------------------------------------------

GENERIC = ("coverage", "roundtrip", "logits", "differential", "elements", "layout")
MTP_ALIASES = ("model.layers.4.embed_tokens.weight", "model.layers.4.shared_head.head.weight")


@pytest.mark.ranks
def test_the_shrunk_deepseek_v3_runs_every_default_oracle_and_names_the_real_bridge_bugs(tmp_path: Path) -> None:
    """The same verdict as tiny:deepseek-v3 (tests/test_deepseek.py): megatron_to_hf_config drops the Yarn scaling
    (conversion/model_bridge.py:732) and the MTP layer's embed_tokens / shared_head.head copies are never exported
    (the mapping oracle, against convcheck's explicit MLA / MTP mappings, names them too)."""
    res = run_cli("verify", "--model", DSV3, "--tp", "2", "--ep", "2", tmp_path=tmp_path)
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    failing = {"coverage", "roundtrip", "elements", "layout"}
    assert res.verdicts() == {
        **{name: "fail" if name in failing else "pass" for name in GENERIC},
        "config": "fail",
        "mapping": "fail",
    }
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert all(oracles[name]["checked"] > 0 for name in (*GENERIC, "config", "mapping"))
    assert [(f["tensor"], f["kind"]) for f in res.findings("config")] == [
        ("rope_parameters.rope_type (megatron_to_hf_config)", "roundtrip-mismatch")
    ]
    assert "source 'yarn', exported 'default'" in res.findings("config")[0]["message"]
    kinds = {"coverage": "not-exported", "roundtrip": "missing", "elements": "never-written", "layout": "missing",
             "mapping": "not-exported"}  # fmt: skip
    for oracle, kind in kinds.items():
        assert {(f["tensor"], f["kind"]) for f in res.findings(oracle)} == {(t, kind) for t in MTP_ALIASES}, oracle
    bugs = {f["tensor"]: f["detail"].get("upstream_bug") for f in res.findings()}
    assert bugs == {
        "rope_parameters.rope_type (megatron_to_hf_config)": "deepseek-yarn-dropped",
        **dict.fromkeys(MTP_ALIASES, "deepseek-mtp-aliases-dropped"),
    }
    assert [c.split(":")[0] for c in res.report["causes"]] == [
        "1 finding(s) are the known megatron-bridge bug deepseek-yarn-dropped",
        "10 finding(s) are the known megatron-bridge bug deepseek-mtp-aliases-dropped",
    ]
    assert {row["verdict"] for row in oracles["mapping"]["tensors"]} == {"pass"}  # every parameter's shards match
    assert res.report["model"] == DSV3
    assert f"replay: convcheck verify --model {DSV3} --tp 2 --ep 2 --oracle " in res.out


@pytest.mark.ranks
def test_a_planted_head_swap_in_a_shrunk_llama_3_is_named_by_tensor_and_first_element(tmp_path: Path) -> None:
    """Llama-3.1-8B's 4 query heads per KV head kept (8 and 2, head_dim 4): the real QKVMapping export swapping layer
    0's first KV head with q's first head (convcheck.mutants.bridge:swap_qk_head0) is named row by row; its llama3
    rope scaling passes the config table (all eight default oracles pass without the hook)."""
    res = run_cli(
        "verify", "--model", "config:tests/data/llama-3.1-8b.config.json", "--tp", "2",
        "--oracle", "coverage,roundtrip,config", "--hook", mutant("bridge", "swap_qk_head0"), tmp_path=tmp_path,
    )  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {"coverage": "pass", "roundtrip": "fail", "config": "pass"}
    findings = {f["tensor"]: f for f in res.findings("roundtrip")}
    assert sorted(findings) == ["model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.q_proj.weight"]
    assert all(f["kind"] == "bytes-differ" for f in findings.values())
    k_message = findings["model.layers.0.self_attn.k_proj.weight"]["message"]
    assert k_message.startswith("128/256 elements differ; first at index [0, 0]: got ")
    assert k_message.endswith(
        "diagnosis: rows taken from other tensors (q/k swap): rows 0:4 <- model.layers.0.self_attn.q_proj.weight 0:4, "
        "rows 4:8 <- itself 4:8"
    )
    assert findings["model.layers.0.self_attn.q_proj.weight"]["message"].startswith(
        "128/1024 elements differ; first at index [0, 0]: got "
    )


HOOKS = Path(__file__).parent / "support" / "hooks_rope.py"
MOONLIGHT = "config:tests/data/moonlight-16b-a3b.config.json"
EPS = ("rms_norm_eps -> layernorm_epsilon", "mismatch")


@pytest.mark.ranks
def test_a_halved_llama3_rope_factor_is_named_by_the_config_table(tmp_path: Path) -> None:
    res = run_cli(
        "verify", "--model", "config:tests/data/llama-3.1-8b.config.json", "--oracle", "config",
        "--hook", f"{HOOKS}:llama3_factor_halved", tmp_path=tmp_path,
    )  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {"config": "fail"}
    findings = {(f["tensor"], f["kind"]): f["message"] for f in res.findings("config")}
    assert sorted(findings) == [
        ("rope_parameters.rope_type (megatron_to_hf_config)", "roundtrip-mismatch"),
        ("rope_parameters.rope_type -> position_embedding_type", "mismatch"),
    ]
    assert findings[("rope_parameters.rope_type -> position_embedding_type", "mismatch")].startswith(
        "rope_parameters.rope_type='llama3' requires position_embedding_type='rope x llama3 8.0'; the Megatron config "
        "has 'rope x llama3 4.0'"
    )
    assert findings[("rope_parameters.rope_type (megatron_to_hf_config)", "roundtrip-mismatch")].endswith(
        "as position_embedding_type: source 'rope x llama3 8.0', exported 'rope x llama3 4.0'"
    )


@pytest.mark.ranks
def test_the_published_moonlight_config_fails_only_on_the_q_kv_norm_eps_megatron_cannot_express(tmp_path: Path) -> None:
    """Moonlight publishes rms_norm_eps 1e-5; HF's kv_a_layernorm always uses 1e-6, Megatron one eps for every norm:
    the config table names it and the logits oracle measures it. Its plain RoPE (megatron-bridge: MLA yarn with
    factor 1) is no finding."""
    res = run_cli("verify", "--model", MOONLIGHT, "--oracle", "config,logits", tmp_path=tmp_path)
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {"config": "fail", "logits": "fail"}
    assert [(f["tensor"], f["kind"]) for f in res.findings("config")] == [EPS]
    assert {(f["tensor"], f["kind"]) for f in res.findings("logits")} == {
        ("greedy-tokens", "greedy-differs"), ("logits", "logits-differ")
    }  # fmt: skip


@pytest.mark.ranks
def test_mla_yarn_left_at_megatrons_default_factor_is_named(tmp_path: Path) -> None:
    res = run_cli(
        "verify", "--model", MOONLIGHT, "--oracle", "config",
        "--hook", f"{HOOKS}:mla_yarn_left_at_megatron_default", tmp_path=tmp_path,
    )  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert [(f["tensor"], f["kind"]) for f in res.findings("config")] == [
        EPS, ("rope_parameters.rope_type -> rope_type", "mismatch")
    ]  # fmt: skip
    assert res.findings("config")[1]["message"].startswith(
        "rope_parameters.rope_type='default' requires rope_type='rope'; the Megatron config has 'yarn'"
    )


# ---- the gated-DeltaNet hybrids (issue #29) ------------------------------------------------------------------------

GDN_PUBLISHED = ("qwen3-next-80b-a3b", "qwen3.5-35b-a3b")
"""Both files were transcribed from memory of the published configs (their `_convcheck_note` key says so; the
shrinker drops it)."""
SCHEDULE = ["linear_attention"] * 3 + ["full_attention"]


def test_a_gdn_config_keeps_its_schedule_prefix_head_ratios_shared_expert_and_mtp() -> None:
    nxt = shrink_file(DATA / "qwen3-next-80b-a3b.config.json")
    c = nxt.spec.config
    assert c["layer_types"] == SCHEDULE and c["num_hidden_layers"] == 4 and "full_attention_interval" not in c
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["hidden_size"]) == (16, 2, 4, 32)
    assert (c["linear_num_key_heads"], c["linear_num_value_heads"]) == (2, 4)  # 16:32 kept as 1:2
    assert (c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]) == (8, 4, 20)
    assert c["shared_expert_intermediate_size"] == 24 and c["partial_rotary_factor"] == 0.25
    assert nxt.spec.mtp_style == "qwen" and "_convcheck_note" not in c


def test_a_qwen35_vl_config_is_shrunk_whole_schedule_mtp_mrope_and_vision_tower() -> None:
    """The published Qwen3.5-35B-A3B config (Qwen3_5MoeForConditionalGeneration) as a whole vision-language model:
    the GDN schedule's prefix, the MTP layer, mrope scaled into a rotary share with room for its three sections, the
    vision tower without deepstack, the multimodal ids moved into the vocabulary, the experts fused."""
    vl = shrink_file(DATA / "qwen3.5-35b-a3b.config.json")
    spec, text = vl.spec, vl.spec.config["text_config"]
    assert (spec.config_class, spec.mtp_layers, spec.mtp_style, spec.packed_experts, spec.experts_transposed) == (
        "Qwen3_5MoeConfig", 1, "qwen", True, False
    )  # fmt: skip
    assert text["layer_types"] == SCHEDULE and text["mtp_num_hidden_layers"] == 1
    assert (text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]) == (4, 2, 16)
    assert text["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000000, "mrope_interleaved": True,
                                       "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5}  # fmt: skip
    assert spec.config["vision_config"]["depth"] == 2 and "deepstack_visual_indexes" not in spec.config["vision_config"]
    ids = [spec.config[k] for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")]
    assert ids == [148, 149, 150, 151] and spec.config["tie_word_embeddings"] is False
    assert "text_config partial_rotary_factor 0.25 -> 0.5 (3 mrope sections need as many rotary pairs of head_dim " \
           "16)" in vl.notes and "text_config mrope_section [11, 11, 10] -> [2, 1, 1] (8 rotary channels of " \
           "head_dim 16)" in vl.notes  # fmt: skip


def test_gdn_layers_keep_a_prefix_with_both_kinds_that_ends_with_full_attention() -> None:
    c = shrink_file(DATA / "qwen3-next-80b-a3b.config.json", layers=8).spec.config
    assert c["layer_types"] == SCHEDULE * 2
    with pytest.raises(BadInput) as info:
        shrink_file(DATA / "qwen3-next-80b-a3b.config.json", layers=5)
    assert "--layers 5 cannot keep the layer schedule" in str(info.value) and "end with full attention" in str(
        info.value
    )


GDN_EXPORT_LOSSES = {
    f"{name} (megatron_to_hf_config)"
    for name in ("linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_value_head_dim",
                 "shared_expert_intermediate_size")
}  # fmt: skip
"""What the real megatron_to_hf_config loses for a shrunk GDN model (GDN_CONFIG_EXPORT_LOSES_SCHEDULE); the
forward direction (every provider rule) holds."""


@pytest.mark.ranks
@pytest.mark.parametrize("name", GDN_PUBLISHED)
def test_a_shrunk_gdn_config_runs_to_a_verdict_naming_the_real_config_export_gap(name: str, tmp_path: Path) -> None:
    res = run_cli("verify", "--model", f"config:tests/data/{name}.config.json", "--tp", "2", "--oracle", "config",
                  tmp_path=tmp_path, timeout=600)  # fmt: skip
    assert res.code == 1, res.out + res.err
    assert res.verdicts() == {"config": "fail"}
    found = {(f["tensor"], f["kind"]) for f in res.findings("config")}
    if name.startswith("qwen3.5"):  # the whole VL model: its export loses text_config and vision_config alike
        assert {f["detail"].get("upstream_bug") for f in res.findings("config")} == {"qwen35-vl-config-export-flat"}
        assert {kind for _, kind in found} == {"roundtrip-mismatch"}
        assert {f"text_config.{t}" for t in GDN_EXPORT_LOSSES if "shared_expert" not in t} <= {t for t, _ in found}
        assert "vision_config.depth (megatron_to_hf_config)" in {t for t, _ in found}
        return
    assert found == {(t, "roundtrip-mismatch") for t in GDN_EXPORT_LOSSES}


# ---- the MoE and hybrid families (issue #56) -----------------------------------------------------------------------

FAMILY_CONFIGS = (
    "gpt-oss-20b", "glm-4.5-air", "olmoe-1b-7b-0125", "glm-4.7-flash", "nemotron-nano-9b-v2", "nemotron-3-nano-30b-a3b",
    "nemotron-3-super-120b-a12b"
)  # fmt: skip
"""Transcribed from the published config.json files as public repositories quote them (their `_convcheck_note`)."""


def _family_knobs(c: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The structural knobs of a gpt_oss / glm4_moe / olmoe / glm4_moe_lite / nemotron_h config (class defaults where
    it is silent), widths and counts left out."""
    from convcheck.fixtures.shrink_rules import collapse, decompose

    c = {**defaults, **c}
    kind = c["model_type"]
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
    rope = _rope(c)
    partial = rope.pop("partial_rotary_factor", None)  # transformers 5 writes it into rope_parameters
    out: dict[str, Any] = {"heads_per_kv_head": heads // kv, "rope": rope}
    out |= {name: c.get(name) for name in ("attention_bias", "hidden_act", "rms_norm_eps", "tie_word_embeddings",
                                            "norm_topk_prob", "routed_scaling_factor")}  # fmt: skip
    out["partial_rotary_factor"] = c.get("partial_rotary_factor", partial)
    if kind == "gpt_oss":
        out |= {"period": decompose(c["layer_types"]).period, "windowed": c["sliding_window"] is not None,
                "router_aux_loss_coef": c["router_aux_loss_coef"], "swiglu_limit": c.get("swiglu_limit")}  # fmt: skip
    if kind in ("glm4_moe", "glm4_moe_lite"):
        first = c.get("first_k_dense_replace", 1)
        out |= {"moe_pattern": collapse(["dense"] * first + ["moe"] * (c["num_hidden_layers"] - first)),
                "shared": c["n_shared_experts"], "groups": (c["n_group"], c["topk_group"]),
                "mtp": c.get("num_nextn_predict_layers"), "qk_norm": c.get("use_qk_norm"),
                "head_dim_is_hidden_over_heads": c.get("head_dim") in (None, c["hidden_size"] // heads),
                "q_lora": c.get("q_lora_rank") is not None}  # fmt: skip
    if kind == "olmoe":
        out |= {"clip_qkv": c["clip_qkv"], "head_dim_given": "head_dim" in c}
    if kind == "nemotron_h":
        names = ("mlp_hidden_act", "mamba_hidden_act", "residual_in_fp32", "layer_norm_epsilon", "use_conv_bias",
                 "mamba_proj_bias", "conv_kernel", "use_bias")  # fmt: skip
        out |= {"layer_kinds": sorted(set(c["hybrid_override_pattern"])), **{name: c[name] for name in names}}
        for name in ("rms_norm_eps", "rope", "partial_rotary_factor"):  # the remote code's: transformers reads none
            del out[name]  # (NemotronHConfig reads layer_norm_epsilon, compared above; its attention has no rotary)
        if "E" in c["hybrid_override_pattern"]:
            same = c["moe_shared_expert_intermediate_size"] == c["moe_intermediate_size"]
            out |= {"shared": c["n_shared_experts"], "groups": (c["n_group"], c["topk_group"]), "same_widths": same,
                    "latent": c.get("moe_latent_size") is not None}  # fmt: skip
        mtp = c.get("mtp_hybrid_override_pattern") or "".join(
            {"attention": "*", "moe": "E", "mamba": "M", "mlp": "-"}[k] for k in c.get("mtp_layers_block_type") or []
        )
        out["mtp"] = (c.get("num_nextn_predict_layers") or 0, mtp if c.get("num_nextn_predict_layers") else "")
    return out


@pytest.mark.parametrize("name", FAMILY_CONFIGS)
def test_a_published_moe_or_hybrid_config_shrinks_with_every_structural_knob_kept(name: str) -> None:
    source = _published(name)
    folder, shrunk = build_from_config(DATA / f"{name}.config.json")
    built = json.loads((folder / "config.json").read_text())
    built.setdefault("hybrid_override_pattern", "".join(
        {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}[k] for k in built.get("layers_block_type") or []
    ))  # fmt: skip
    defaults = class_fields(shrunk.spec.config_class).own
    assert _family_knobs(built, defaults) == _family_knobs(source, defaults)
    assert built["architectures"] == source["architectures"]
    ckpt = open_checkpoint(folder)
    for tname, entry in ckpt.tensors.items():
        with safe_open(str(folder / entry.file), "pt") as fh:
            t = fh.get_tensor(tname)
        assert t.numel() <= POOL_SIZE and int_view(t).unique().numel() == t.numel(), tname


def test_each_family_shrinks_to_what_its_tiny_fixture_proves() -> None:
    """The knobs and widths of each shrunk model, and the lines saying what changed."""
    oss = shrink_file(DATA / "gpt-oss-20b.config.json")
    c = oss.spec.config
    assert c["layer_types"] == ["sliding_attention", "full_attention"] * 2 and c["sliding_window"] == 4
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["hidden_size"]) == (16, 2, 8, 32)
    assert (c["num_local_experts"], c["num_experts_per_tok"], c["intermediate_size"]) == (8, 4, 10)
    assert "dropped experts_per_token=4 (OpenAI's reference code's name for num_experts_per_tok (checked equal))" \
        in oss.notes  # fmt: skip
    assert c["rope_scaling"]["rope_type"] == "yarn" and c["swiglu_limit"] == 7.0 and "initial_context_length" not in c
    assert "the published experts are square (intermediate_size == hidden_size); tiny:gpt-oss-square proves that " \
        "case" in oss.notes  # fmt: skip
    glm = shrink_file(DATA / "glm-4.5-air.config.json")
    c = glm.spec.config
    assert (c["first_k_dense_replace"], c["num_hidden_layers"], c["n_shared_experts"], c["n_routed_experts"]) == (
        1, 4, 1, 8
    )  # fmt: skip
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (24, 2, 4)
    assert glm.spec.fp32_tensors == ("e_score_correction_bias",) and glm.spec.mtp_layers == 1
    lite = shrink_file(DATA / "glm-4.7-flash.config.json").spec
    assert lite.config["mlp_layer_types"] == ["dense", "sparse", "sparse", "sparse"] and lite.mtp_layers == 1
    assert (lite.config["q_lora_rank"], lite.config["kv_lora_rank"], lite.config["routed_scaling_factor"]) == (
        24, 16, 1.8
    )  # fmt: skip
    olmoe = shrink_file(DATA / "olmoe-1b-7b-0125.config.json").spec.config
    assert (olmoe["num_experts"], olmoe["num_experts_per_tok"], olmoe["num_hidden_layers"]) == (8, 4, 2)
    assert "head_dim" not in olmoe and olmoe["norm_topk_prob"] is False
    nem = shrink_file(DATA / "nemotron-nano-9b-v2.config.json")
    assert nem.spec.config["hybrid_override_pattern"] == "-M*-" and "attention_head_dim" not in nem.spec.config
    assert "rms_norm_eps" not in nem.spec.config and nem.spec.config["layer_norm_epsilon"] == 1e-5
    assert nem.spec.renames == {"backbone.embedding.weight": "backbone.embeddings.weight"}
    assert "hybrid_override_pattern 56 layers (M x27, * x4, - x25) -> '-M*-': the shortest stretch of the " \
        "published pattern holding every layer kind" in nem.notes  # fmt: skip
    nano3 = shrink_file(DATA / "nemotron-3-nano-30b-a3b.config.json").spec
    assert nano3.config["hybrid_override_pattern"] == "EM*E" and nano3.fp32_tensors == ("gate.e_score_correction_bias",)
    c = nano3.config
    assert (c["n_routed_experts"], c["num_experts_per_tok"], c["n_shared_experts"]) == (8, 4, 1)
    assert (nano3.config["moe_intermediate_size"], nano3.config["moe_shared_expert_intermediate_size"]) == (16, 20)
    assert "dropped time_step_rank=256 (NemotronH remote code's dt rank; NemotronHConfig has one dt per Mamba " \
        "head)" in nem.notes  # fmt: skip


def test_a_hybrid_pattern_keeps_a_stretch_with_every_kind() -> None:
    from convcheck.fixtures.shrink_moe import nemotron_stretch

    assert nemotron_stretch("M-M*-M") == "-M*-"
    assert nemotron_stretch("MEMEM*EMEMEM*E") == "EM*E"
    assert nemotron_stretch("M-M-M*-", 5) == "-M-M*"
    with pytest.raises(BadInput, match=r"^--layers 2 cannot keep the hybrid pattern"):
        nemotron_stretch("M-M*-", 2)


def test_kimi_k2s_model_type_is_built_by_deepseek_v3s_class_and_said_so() -> None:
    kimi = shrink_file(DATA / "kimi-k2-instruct.config.json")
    c = kimi.spec.config
    assert (kimi.spec.config_class, c["model_type"]) == ("DeepseekV3Config", "deepseek_v3")
    assert (c["n_group"], c["topk_group"], c["routed_scaling_factor"], c["first_k_dense_replace"]) == (1, 1, 2.827, 1)
    assert c["rope_scaling"] == {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                                 "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                 "rope_type": "yarn"}  # fmt: skip
    assert [n for n in kimi.notes if n.startswith("model_type")] == [
        "model_type 'kimi_k2' -> 'deepseek_v3': Moonshot's remote-code name for DeepSeek-V3's config "
        "(DeepseekV3ForCausalLM); transformers' DeepseekV3Config builds it"
    ]


def test_a_family_config_that_contradicts_itself_is_refused_in_one_line() -> None:
    oss, lite = _published("gpt-oss-20b"), _published("glm-4.7-flash")
    with pytest.raises(BadInput, match=r"^experts_per_token=2 disagrees with num_experts_per_tok=4$"):
        shrink_config({**oss, "experts_per_token": 2}, class_fields("GptOssConfig"), name="x")
    with pytest.raises(BadInput, match=r"^first_k_dense_replace=1 disagrees with mlp_layer_types$"):
        shrink_config({**lite, "mlp_layer_types": ["dense"] * 2 + ["sparse"] * 45}, class_fields("Glm4MoeLiteConfig"),
                      name="x")  # fmt: skip
    nem = _published("nemotron-nano-9b-v2")
    with pytest.raises(BadInput, match=r"^hybrid_override_pattern must use M\*-E for each layer, got 'MX'$"):
        shrink_config({**nem, "hybrid_override_pattern": "MX", "num_hidden_layers": 2},
                      class_fields("NemotronHConfig"), name="x")  # fmt: skip


@pytest.mark.ranks
def test_the_shrunk_gpt_oss_20b_fails_only_on_the_two_known_export_bugs_at_tp2_ep2(tmp_path: Path) -> None:
    """The same verdict as tiny:gpt-oss (tests/test_gpt_oss.py): every oracle passes but config, which names
    gpt-oss-sliding-window-export and gpt-oss-attention-bias-export (megatron_to_hf_config)."""
    model = "config:tests/data/gpt-oss-20b.config.json"
    res = run_cli("verify", "--model", model, "--tp", "2", "--ep", "2", tmp_path=tmp_path, timeout=600)
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    assert res.verdicts() == {**dict.fromkeys((*GENERIC, "mapping"), "pass"), "config": "fail"}
    assert {f["tensor"]: (f["kind"], f["detail"].get("upstream_bug")) for f in res.findings("config")} == {
        "attention_bias (megatron_to_hf_config)": ("roundtrip-mismatch", "gpt-oss-attention-bias-export"),
        "sliding_window (megatron_to_hf_config)": ("roundtrip-mismatch", "gpt-oss-sliding-window-export"),
    }
    oracles = {o["name"]: o for o in res.report["oracles"]}
    assert oracles["logits"]["metrics"]["greedy_match"] == "32/32"


GLM45_ALIASES = ("model.layers.4.embed_tokens.weight", "model.layers.4.shared_head.head.weight")


@pytest.mark.ranks
def test_the_shrunk_glm_4_5_air_fails_only_on_the_known_mtp_alias_export_bug_at_tp2_ep2(tmp_path: Path) -> None:
    """The same verdict as tiny:glm4.5-air: the GLM-4.5 bridge never exports the MTP layer's embed_tokens /
    shared_head.head copies (glm45-mtp-aliases-dropped); config, logits and every other parameter pass."""
    model = "config:tests/data/glm-4.5-air.config.json"
    res = run_cli("verify", "--model", model, "--tp", "2", "--ep", "2", "--oracle",
                  "coverage,roundtrip,config,logits,mapping", tmp_path=tmp_path, timeout=600)  # fmt: skip
    assert res.code == 1, res.out[-3000:] + res.err[-2000:]
    failing = ("coverage", "roundtrip", "mapping")
    assert res.verdicts() == {**dict.fromkeys(failing, "fail"), "config": "pass", "logits": "pass"}
    kinds = {"coverage": "not-exported", "roundtrip": "missing", "mapping": "not-exported"}
    for oracle, kind in kinds.items():
        assert {(f["tensor"], f["kind"]) for f in res.findings(oracle)} == {(t, kind) for t in GLM45_ALIASES}, oracle
    assert {f["detail"].get("upstream_bug") for f in res.findings()} == {"glm45-mtp-aliases-dropped"}


# ---- Gemma 3 VL (issue #56) ------------------------------------------------------------------------------------------


def test_a_gemma3_vl_config_is_shrunk_whole_tower_projector_and_tokens() -> None:
    """The published gemma-3-4b-it config (Gemma3ForConditionalGeneration; its text_config partial, Gemma3TextConfig's
    defaults filling the rest): the text model by Gemma 3 text's rules (5:1 pattern, linear 8 on the global RoPE,
    tied), the SigLIP tower without head as published, the projector pooling 2x2 to 4 soft tokens, the three image
    ids moved into the vocabulary, the tower under the published `vision_tower.vision_model.` names."""
    shrunk = shrink_file(DATA / "gemma-3-4b-it.config.json")
    spec, text, vision = shrunk.spec, shrunk.spec.config["text_config"], shrunk.spec.config["vision_config"]
    assert spec.config_class == "Gemma3Config" and spec.config["tie_word_embeddings"] is True
    assert text["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 2
    assert text["rope_parameters"]["full_attention"] == {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}
    assert (text["hidden_size"], text["vocab_size"], text["sliding_window"]) == (32, 152, 4)
    assert vision["vision_use_head"] is False and (vision["image_size"], vision["patch_size"]) == (16, 4)
    assert spec.config["mm_tokens_per_image"] == 4
    assert [spec.config[k] for k in ("boi_token_index", "eoi_token_index", "image_token_index")] == [149, 150, 151]
    assert spec.renames["vision_tower.post_layernorm.weight"] == "vision_tower.vision_model.post_layernorm.weight"
    assert "vision_tower.head.probe" not in spec.renames
    assert spec.special_tokens["image_token:<image_soft_token>"] == 151
    assert "mm_tokens_per_image 256 -> 4 (the 4x4 patch grid pooled 2x2)" in shrunk.notes


def test_a_gemma3_vl_config_without_vision_use_head_keeps_the_pooling_head_and_a_non_square_count_is_refused() -> None:
    """Where vision_config names no vision_use_head, transformers builds the pooling head (the bridge's
    gemma3-vl-pooling-head-dropped): the shrunk tower keeps it, its names in the published namespace; a soft-token count
    that is no square cannot be pooled from a square grid (one line)."""
    from convcheck.fixtures.shrink_gemma3_vl import shrink_gemma3_vl

    config = _published("gemma-3-4b-it")
    del config["vision_config"]["vision_use_head"]
    shrunk = shrink_gemma3_vl(config, class_fields, name="x")
    assert "vision_use_head" not in shrunk.spec.config["vision_config"]
    assert shrunk.spec.renames["vision_tower.head.probe"] == "vision_tower.vision_model.head.probe"
    with pytest.raises(BadInput, match="mm_tokens_per_image 200 is not a square"):
        shrink_gemma3_vl({**config, "mm_tokens_per_image": 200}, class_fields, name="x")
    with pytest.raises(BadInput, match="is not Gemma3ForConditionalGeneration"):
        shrink_gemma3_vl({**config, "architectures": ["Gemma3ForCausalLM"]}, class_fields, name="x")
