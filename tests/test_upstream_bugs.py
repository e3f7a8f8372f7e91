"""Known megatron-bridge bugs (convcheck.models.upstream_bug): tagged, named once, never hiding a failure, never
credited to a planted bug, never a false alarm of a clean selftest run."""

from __future__ import annotations

from dataclasses import replace

from convcheck.models import UPSTREAM_BUG, tag_upstream_bugs
from convcheck.models.deepseek import MTP_ALIASES_DROPPED, YARN_DROPPED
from convcheck.mutants.catalog import MUTANTS
from convcheck.verdict import FAIL, Finding, OracleVerdict, Report
from convcheck.workflows.kill_matrix import Launch, attribute, clean_row

ALIAS = Finding(tensor="model.layers.4.embed_tokens.weight", kind="missing", message="gone")
OTHER = Finding(tensor="model.layers.1.mlp.experts.0.up_proj.weight", kind="missing", message="gone")


def _roundtrip(*findings: Finding) -> OracleVerdict:
    return OracleVerdict(name="roundtrip", checked=10, findings=findings)


def test_a_finding_a_known_bug_explains_is_tagged_and_still_fails() -> None:
    (verdict,), lines = tag_upstream_bugs("DeepseekV3ForCausalLM", "0.6.2", [_roundtrip(ALIAS, OTHER)])
    assert verdict.verdict == FAIL
    assert [f.detail.get(UPSTREAM_BUG) for f in verdict.findings] == [MTP_ALIASES_DROPPED.name, None]
    assert lines == [
        "1 finding(s) are the known megatron-bridge bug deepseek-mtp-aliases-dropped: the export never writes an MTP "
        "layer's embed_tokens / shared_head.head, the copies of model.embed_tokens and lm_head that published "
        "DeepSeek-V3 checkpoints hold (the GLM-4.7-Flash bridge restores them, glm/glm47_flash_bridge.py:116) "
        "(megatron/bridge/models/deepseek/common.py:117 (get_common_mapping_list maps no MTP alias); not fixed "
        "upstream yet)"
    ]


def test_nothing_is_tagged_on_another_release_family_oracle_or_kind() -> None:
    for arch, version, verdict in [
        ("DeepseekV3ForCausalLM", "0.3.1", _roundtrip(ALIAS)),  # not seen there: not explained
        ("Qwen3MoeForCausalLM", "0.6.2", _roundtrip(ALIAS)),
        ("?", "0.6.2", _roundtrip(ALIAS)),
        ("DeepseekV3ForCausalLM", "0.6.2", OracleVerdict(name="differential", checked=1, findings=(ALIAS,))),
        ("DeepseekV3ForCausalLM", "0.6.2", _roundtrip(Finding(tensor=ALIAS.tensor, kind="bytes-differ", message=""))),
    ]:
        (tagged,), lines = tag_upstream_bugs(arch, version, [verdict])
        assert tagged == verdict and lines == [], (arch, version, verdict.name)


def test_the_yarn_bug_names_its_config_finding() -> None:
    config = OracleVerdict(
        name="config",
        checked=3,
        findings=(Finding(tensor="rope_parameters.rope_type (megatron_to_hf_config)", kind="roundtrip-mismatch",
                          message="x"),),
    )  # fmt: skip
    (tagged,), lines = tag_upstream_bugs("DeepseekV3ForCausalLM", "0.6.2", [config])
    assert tagged.findings[0].detail == {UPSTREAM_BUG: YARN_DROPPED.name}
    assert len(lines) == 1 and lines[0].startswith("1 finding(s) are the known megatron-bridge bug deepseek-yarn")


def _report(*verdicts: OracleVerdict) -> Report:
    return Report(model="tiny:deepseek-v3", layout={}, device="cpu", versions={}, oracles=verdicts)


def test_a_clean_run_with_only_known_bugs_is_no_false_alarm_and_no_mutant_is_credited_with_them() -> None:
    (known,), _ = tag_upstream_bugs("DeepseekV3ForCausalLM", "0.6.2", [_roundtrip(ALIAS)])
    launch = Launch(fixture="tiny:deepseek-v3", layout="tp2ep2", oracles=("roundtrip",))
    row = clean_row(launch, _report(known), None, 1.0)
    assert (row.passed, row.failing, row.first_finding, row.upstream_bugs) == (
        True, (), None, (MTP_ALIASES_DROPPED.name,)
    )  # fmt: skip
    (mixed,), _ = tag_upstream_bugs("DeepseekV3ForCausalLM", "0.6.2", [_roundtrip(ALIAS, OTHER)])
    row = clean_row(launch, _report(mixed), None, 1.0)
    assert (row.passed, row.failing) == (False, ("roundtrip",))
    assert row.first_finding == "roundtrip: model.layers.1.mlp.experts.0.up_proj.weight [missing] gone"
    mutant = next(m for m in MUTANTS if m.name == "shared_expert_as_routed0")
    found = attribute(_report(mixed), [mutant])
    assert [f.tensor for f in found.credited[mutant.name]["roundtrip"]] == [OTHER.tensor]
    assert found.unclaimed == ()


def test_the_support_table_bugs_tag_their_own_architecture_only() -> None:
    """The bugs `convcheck support` found (convcheck.models.registered_bugs) tag their architecture's findings on
    0.6.2 and nothing of another architecture."""
    from convcheck.models.registered_bugs import DEEPSEEK_V4_ROPE_NEEDS_YARN, EXAONE4_UNTIED_LM_HEAD_UNMAPPED

    build = Finding(tensor="<build>", kind="build-failed", message="KeyError: 'factor'")
    unmapped = Finding(tensor="output_layer.weight", kind="unmapped", message="no bridge mapping")
    coverage = OracleVerdict(name="coverage", checked=3, findings=(build, unmapped))
    cases = [("DeepseekV4ForCausalLM", [DEEPSEEK_V4_ROPE_NEEDS_YARN.name, None]),
             ("Exaone4ForCausalLM", [None, EXAONE4_UNTIED_LM_HEAD_UNMAPPED.name]),
             ("Qwen3ForCausalLM", [None, None])]  # fmt: skip
    for arch, expected in cases:
        (verdict,), _ = tag_upstream_bugs(arch, "0.6.2", [coverage])
        assert [f.detail.get(UPSTREAM_BUG) for f in verdict.findings] == expected, arch
        assert verdict.verdict == FAIL


def test_a_consequence_is_tagged_only_beside_its_cause() -> None:
    """The logits of a NemotronH model whose embedding transformers saved under the wrong name are tagged with that
    bug only in a run that shows the embedding's coverage finding; alone (a planted bug the logits catch) they stay
    untagged, and the verdict fails either way."""
    from convcheck.models.registered_bugs import TRANSFORMERS_EMBEDDING_SAVED_SINGULAR as BUG

    logits = OracleVerdict(name="logits", checked=4, findings=(
        Finding(tensor="logits", kind="logits-differ", message="max abs error nan"),
        Finding(tensor="greedy-tokens", kind="greedy-differs", message="32/32"),
    ))  # fmt: skip
    cause = Finding(tensor="embedding.word_embeddings.weight", kind="hf-missing", message="not in the checkpoint")
    coverage = OracleVerdict(name="coverage", checked=3, findings=(cause,))
    versions = {"megatron-bridge": "0.6.2", "transformers": "5.12.1"}
    alone, lines = tag_upstream_bugs("NemotronHForCausalLM", "0.6.2", [logits], versions)
    assert [f.detail.get(UPSTREAM_BUG) for f in alone[0].findings] == [None, None] and lines == []
    both, lines = tag_upstream_bugs("NemotronHForCausalLM", "0.6.2", [coverage, logits], versions)
    assert [f.detail.get(UPSTREAM_BUG) for v in both for f in v.findings] == [BUG.name] * 3
    assert len(lines) == 1 and lines[0].startswith("3 finding(s) are the known transformers bug")
    assert all(v.verdict == FAIL for v in both)
    other, _ = tag_upstream_bugs("NemotronHForCausalLM", "0.6.2", [coverage, logits], {"transformers": "5.16.0"})
    assert [f.detail.get(UPSTREAM_BUG) for v in other for f in v.findings] == [None] * 3


def test_ernie45_bridge_routes_by_sigmoid_where_transformers_takes_a_softmax() -> None:
    """ernie45-moe-sigmoid-router still holds: transformers' own Ernie 4.5 router against megatron-core's routing
    with the score function the bridge sets (read from its source): the expert weights differ; with softmax they
    agree. Fails (then drop the bug) when the bridge stops asking for sigmoid."""
    import inspect

    import torch

    from convcheck import compat

    compat.install_import_shims()
    from megatron.bridge.models.ernie.ernie_45_bridge import Ernie45Bridge
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function
    from transformers import Ernie4_5_MoeConfig
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeTopKRouter

    assert 'moe_router_score_function = "sigmoid"' in inspect.getsource(Ernie45Bridge.provider_bridge)
    router = Ernie4_5_MoeTopKRouter(Ernie4_5_MoeConfig(hidden_size=64, moe_num_experts=4, moe_k=2))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(torch.randn(4, 64, generator=gen) * 0.02)
    tokens = torch.randn(8, 64, generator=gen)
    _, chosen, weights = router(tokens)
    hf = torch.zeros(8, 4).scatter(1, chosen, weights)
    logits = torch.nn.functional.linear(tokens, router.weight)
    errors = {}
    for score in ("sigmoid", "softmax"):
        probs, routed = topk_routing_with_score_function(logits, 2, use_pre_softmax=False, score_function=score,
                                                         expert_bias=torch.zeros(4))  # fmt: skip
        assert torch.equal(routed, hf > 0), score  # the same experts; only their weights differ
        errors[score] = float((probs - hf).abs().max())
    assert errors["sigmoid"] > 1e-2 and errors["softmax"] < 1e-6, errors


def test_the_support_dtype_and_head_bugs_are_still_in_the_upstream_source() -> None:
    """The upstream lines the Ernie 4.5 gate, MiniMax-M3 fp32 and Gemma 3 VL pooling-head bugs name still do what the
    bugs say (a release that changes them fails here: then re-check the bug); each tags its own architecture."""
    import inspect

    from convcheck import compat
    from convcheck.models.ernie_vl_bugs import ERNIE45_VL_ROUTER_GATES_BF16
    from convcheck.models.registered_bugs import (
        ERNIE45_ROUTER_GATE_BF16,
        GEMMA3_VL_POOLING_HEAD_DROPPED,
        MINIMAX_M3_FP32_EXPORT,
        QWEN3_OMNI_TALKER_CODE2WAV_DROPPED,
        QWEN25_OMNI_TIE_FROM_TEXT_CONFIG,
    )

    compat.install_import_shims()
    from megatron.bridge.models.gemma_vl import gemma3_vl_bridge
    from megatron.bridge.models.minimax_m3 import minimax_m3_bridge, modeling_minimax_m3_vl
    from megatron.core.transformer.moe import router
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoePreTrainedModel
    from transformers.models.siglip import modeling_siglip

    assert "vision_config.vision_use_head = False" in inspect.getsource(gemma3_vl_bridge)
    assert 'not hasattr(config, "vision_use_head")' in inspect.getsource(modeling_siglip.SiglipVisionModel)
    assert "module.weight.data.float()" in inspect.getsource(minimax_m3_bridge._promote_router_weights_to_float32)
    assert "_keep_in_float32_parameter_names" in inspect.getsource(modeling_minimax_m3_vl)
    assert "self.weight.data.to(dtype=self.config.params_dtype)" in inspect.getsource(
        router
    )  # the file: a shim may wrap methods
    assert "gate.weight" in Ernie4_5_MoePreTrainedModel._keep_in_fp32_modules_strict
    from megatron.bridge.models.ernie_vl import ernie45_vl_bridge
    from transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe import Ernie4_5_VLMoePreTrainedModel

    assert "gate.weight" in Ernie4_5_VLMoePreTrainedModel._keep_in_fp32_modules_strict
    vl_routers = inspect.getsource(ernie45_vl_bridge.Ernie45VLBridge.mapping_registry).split("router.weight")
    assert len(vl_routers) == 3 and "float32" not in inspect.getsource(ernie45_vl_bridge)  # plain AutoMappings
    from megatron.bridge.models.falcon_h1 import falconh1_bridge
    from megatron.bridge.models.qwen_omni import qwen25_omni_bridge
    from megatron.core.ssm import mamba_mixer
    from transformers import FalconH1Config, Qwen2_5OmniConfig

    assert '("mamba_norm_before_gate", "norm_before_gate")' in inspect.getsource(falconh1_bridge)
    assert "assert not self.norm_before_gate" in inspect.getsource(
        mamba_mixer
    )  # the file: shim 8 wraps MambaMixer.__init__
    assert FalconH1Config().mamba_norm_before_gate is True
    omni = inspect.getsource(qwen25_omni_bridge.Qwen25OmniBridge)
    assert 'getattr(text_config, "tie_word_embeddings", False)' in omni
    mappings = omni.split("def mapping_registry")[1]
    assert "talker" not in mappings and "token2wav" not in mappings
    from megatron.bridge.models.qwen_omni import qwen3_omni_bridge

    omni3 = inspect.getsource(qwen3_omni_bridge.Qwen3OmniBridge).split("def mapping_registry")[1]
    assert "thinker." in omni3 and "talker" not in omni3 and "code2wav" not in omni3
    from megatron.bridge.models.qwen_vl import qwen25_vl_bridge, qwen25_vl_provider

    assert "mrope_section" not in inspect.getsource(qwen25_vl_bridge)
    assert qwen25_vl_provider.Qwen25VLModelProvider().mrope_section == [16, 24, 24]
    thinker = Qwen2_5OmniConfig().thinker_config
    assert (thinker.tie_word_embeddings, thinker.text_config.tie_word_embeddings) == (False, True)
    cases = [("Ernie4_5_MoeForCausalLM", "model.layers.1.mlp.gate.weight", ERNIE45_ROUTER_GATE_BF16),
             ("Ernie4_5_VLMoeForConditionalGeneration", "model.layers.1.mlp.gate.weight_1",
              ERNIE45_VL_ROUTER_GATES_BF16),
             ("MiniMaxM3SparseForConditionalGeneration",
              "vision_tower.vision_model.embeddings.patch_embedding.weight", MINIMAX_M3_FP32_EXPORT)]  # fmt: skip
    for arch, tensor, bug in cases:
        roundtrip = _roundtrip(Finding(tensor=tensor, kind="dtype", message="dtype float32, expected bfloat16"))
        for who in (arch, "Qwen3ForCausalLM"):
            (verdict,), _ = tag_upstream_bugs(who, "0.6.2", [roundtrip])
            assert verdict.findings[0].detail.get(UPSTREAM_BUG) == (bug.name if who == arch else None), who
    untied = _roundtrip(Finding(tensor="thinker.lm_head.weight", kind="bytes-differ", message="the embedding"))
    logits = OracleVerdict(name="logits", checked=8, findings=(
        Finding(tensor="logits", kind="logits-differ", message="max abs error 1.17"),))  # fmt: skip
    for verdicts, tagged in (([untied, logits], [QWEN25_OMNI_TIE_FROM_TEXT_CONFIG.name] * 2), ([logits], [None])):
        out, _ = tag_upstream_bugs("Qwen2_5OmniForConditionalGeneration", "0.6.2", verdicts)
        assert [f.detail.get(UPSTREAM_BUG) for v in out for f in v.findings] == tagged  # the logits: a consequence
    talker = _roundtrip(Finding(tensor="code2wav.decoder.5.alpha", kind="missing", message="in the source only"))
    for who in ("Qwen3OmniMoeForConditionalGeneration", "Qwen2_5OmniForConditionalGeneration"):
        (verdict,), _ = tag_upstream_bugs(who, "0.6.2", [talker])
        expected = QWEN3_OMNI_TALKER_CODE2WAV_DROPPED.name if who.startswith("Qwen3") else None
        assert verdict.findings[0].detail.get(UPSTREAM_BUG) == expected, who
    head = OracleVerdict(name="coverage", checked=1, findings=(
        Finding(tensor="vision_tower.head.probe", kind="not-exported", message="never produced"),))  # fmt: skip
    (verdict,), _ = tag_upstream_bugs("Gemma3ForConditionalGeneration", "0.6.2", [head])
    assert verdict.findings[0].detail.get(UPSTREAM_BUG) == GEMMA3_VL_POOLING_HEAD_DROPPED.name


def test_the_gemma4_bugs_of_bridge_0_5_tag_their_own_variant_and_release_only() -> None:
    """Bridge 0.5.x builds a dense Gemma 4 as MoE (one bug explains every finding of a dense checkpoint there); the
    MoE variant's roundtrip byte difference on gate_proj is its weight folding; neither tags 0.6.2 nor the other
    variant."""
    gate = Finding(tensor="model.layers.0.mlp.gate_proj.weight", kind="bytes-differ", message="200/2048 differ")
    for version, config, bug in (
        ("0.5.1", {"enable_moe_block": False}, "gemma4-dense-built-as-moe"),
        ("0.5.0", {"enable_moe_block": True}, "gemma4-moe-fused-weights-not-bitwise"),
        ("0.6.2", {"enable_moe_block": False}, None),
        ("0.6.2", {"enable_moe_block": True}, None),
    ):
        (verdict,), _ = tag_upstream_bugs("Gemma4ForCausalLM", version, [_roundtrip(gate)], config=config)
        assert verdict.verdict == FAIL and verdict.findings[0].detail.get(UPSTREAM_BUG) == bug, (version, config)


def test_the_qwen3_moe_norm_topk_bug_tags_the_older_releases_config_and_its_logits_only() -> None:
    """`qwen3-moe-norm-topk-prob-ignored` on the findings `convcheck support` saw on 0.5.1 (transformers' default
    norm_topk_prob false): the config rule's mismatch, then the logits it causes; on 0.6.2 (fixed) nothing, and a
    logits finding with no config finding explained is not tagged."""
    from convcheck.models.qwen3_moe import NORM_TOPK_PROB_IGNORED as bug

    rule = Finding(tensor="norm_topk_prob -> moe_router_pre_softmax", kind="mismatch", message="requires True")
    logits = Finding(tensor="logits", kind="logits-differ", message="max abs error 0.0249")
    config = OracleVerdict(name="config", checked=5, findings=(rule,))
    forward = OracleVerdict(name="logits", checked=9, findings=(logits,))
    tagged, lines = tag_upstream_bugs("Qwen3MoeForCausalLM", "0.5.1", [config, forward])
    assert [f.detail.get(UPSTREAM_BUG) for v in tagged for f in v.findings] == [bug.name, bug.name]
    assert len(lines) == 1 and lines[0].startswith(f"2 finding(s) are the known megatron-bridge bug {bug.name}: ")
    assert tag_upstream_bugs("Qwen3MoeForCausalLM", "0.6.2", [config, forward])[1] == []
    (alone,), _ = tag_upstream_bugs("Qwen3MoeForCausalLM", "0.5.1", [forward])
    assert alone == forward


def test_the_per_expert_checkpoint_bug_tags_its_export_names_and_the_import_they_explain() -> None:
    """`qwen35-moe-per-expert-checkpoint-not-read` (bridge 0.5.1, grouped experts): the export's fused names where the
    checkpoint holds per-expert ones are the bug; the import's KeyError and the never-loaded parameters follow it.
    An import failure with no such export finding (another cause) is not tagged."""
    from convcheck.models.qwen_next import PER_EXPERT_CHECKPOINT_NOT_READ as bug

    fused = Finding(tensor="model.layers.0.mlp.experts.gate_up_proj", kind="unexpected", message="not in source")
    raised = "bridge.load_hf_weights raised KeyError: 'Key not found: model.layers.0.mlp.experts.gate_up_proj'"
    crash = Finding(tensor="<import>", kind="import-failed", message=raised)
    idle = Finding(tensor="decoder.layers.0.self_attention.A_log", kind="not-loaded", message="kept its value")
    coverage = OracleVerdict(name="coverage", checked=3, findings=(crash, idle, fused))
    for arch in ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"):
        (tagged,), lines = tag_upstream_bugs(arch, "0.5.1", [coverage])
        assert [f.detail.get(UPSTREAM_BUG) for f in tagged.findings] == [bug.name] * 3, arch
        assert len(lines) == 1
    (alone,), _ = tag_upstream_bugs("Qwen3_5MoeForCausalLM", "0.5.1", [replace(coverage, findings=(crash, idle))])
    assert all(UPSTREAM_BUG not in f.detail for f in alone.findings)
    assert tag_upstream_bugs("Qwen3_5MoeForCausalLM", "0.6.2", [coverage])[1] == []


def test_the_0_4_qwen2_audio_bugs_tag_the_unmapped_position_table_its_crashes_and_the_fp32_export() -> None:
    """Bridge 0.4.x builds Qwen2-Audio's language model with learned position embeddings (unmapped: the import and
    export raise, nothing loads) and in fp32: the findings a 0.4.2 run of a transformers-written checkpoint gives are
    those two bugs; the crashes alone (no unmapped table) and the same findings on 0.6.2 are not tagged."""
    from convcheck.models.registered_bugs import QWEN2_AUDIO_DTYPE_FROM_TEXT_CONFIG as fp32
    from convcheck.models.registered_bugs import QWEN2_AUDIO_LEARNED_POSITIONS as learned

    table = "language_model.embedding.position_embeddings.weight"
    crash = Finding(tensor="<import>", kind="import-failed", message="AttributeError: 'NoneType' object has no "
                    "attribute 'megatron_module'")  # fmt: skip
    idle = Finding(tensor="audio_tower.conv1.weight", kind="not-loaded", message="kept its pre-load value")
    unmapped = Finding(tensor=table, kind="unmapped", message="no bridge mapping")
    coverage = OracleVerdict(name="coverage", checked=9, findings=(crash, idle, unmapped))
    raised = Finding(tensor=table, kind="forward-failed", message="TypeError: embedding(): argument 'indices'")
    forward = OracleVerdict(name="logits", checked=1, findings=(raised,))
    dtype = _roundtrip(Finding(tensor="audio_tower.conv1.weight", kind="dtype", message="float32, expected bfloat16"))
    arch = "Qwen2AudioForConditionalGeneration"
    tagged, lines = tag_upstream_bugs(arch, "0.4.2", [coverage, forward, dtype])
    assert [[f.detail.get(UPSTREAM_BUG) for f in v.findings] for v in tagged] == [
        [learned.name] * 3, [learned.name], [fp32.name]]  # fmt: skip
    assert [line.split(":")[0] for line in lines] == [
        f"4 finding(s) are the known megatron-bridge bug {learned.name}",
        f"1 finding(s) are the known megatron-bridge bug {fp32.name}",
    ]
    (alone,), _ = tag_upstream_bugs(arch, "0.4.2", [replace(coverage, findings=(crash, idle))])
    assert all(UPSTREAM_BUG not in f.detail for f in alone.findings)
    assert tag_upstream_bugs(arch, "0.6.2", [coverage, forward, dtype])[1] == []


def test_the_0_4_export_crash_on_a_tensor_the_checkpoint_lacks_tags_the_crash_and_what_it_never_exported() -> None:
    """Bridge 0.4.x raises `Unknown parallelism type: None` from the export when one mapped tensor is missing from the
    checkpoint (seen on NemotronH written by transformers 5.3.0): that crash and every tensor the export then never
    produced are the bug, for any architecture; another export crash, and the same crash on 0.5.x (which returns
    nothing for such a task: the fix is in the pinned source), are not."""
    import inspect

    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    from convcheck.models.bridge_wide import EXPORT_RAISES_ON_A_MISSING_TENSOR as bug

    raised = ("bridge.export_hf_weights raised ValueError: Unknown parallelism type: None at "
              "megatron/bridge/models/conversion/param_mapping.py:1192")  # fmt: skip
    crash = Finding(tensor="<export>", kind="export-failed", message=raised)
    never = Finding(tensor="backbone.layers.0.mixer.A_log", kind="not-exported", message="never produced")
    coverage = OracleVerdict(name="coverage", checked=2, findings=(crash, never))
    roundtrip = _roundtrip(Finding(tensor="backbone.norm_f.weight", kind="missing", message="not in the export"))
    for arch in ("NemotronHForCausalLM", "LlamaForCausalLM"):
        tagged, lines = tag_upstream_bugs(arch, "0.4.2", [coverage, roundtrip])
        assert [[f.detail.get(UPSTREAM_BUG) for f in v.findings] for v in tagged] == [[bug.name] * 2, [bug.name]]
        assert [line.split(":")[0] for line in lines] == [f"3 finding(s) are the known megatron-bridge bug {bug.name}"]
    other = replace(crash, message="bridge.export_hf_weights raised KeyError: 'x'")
    (alone, _), _ = tag_upstream_bugs("LlamaForCausalLM", "0.4.2", [replace(coverage, findings=(other, never)),
                                                                     roundtrip])  # fmt: skip
    assert all(UPSTREAM_BUG not in f.detail for f in alone.findings)
    assert tag_upstream_bugs("NemotronHForCausalLM", "0.5.1", [coverage, roundtrip])[1] == []
    source = inspect.getsource(AutoMapping.megatron_to_hf)
    assert "if self._detected_type is None:\n                return {}" in source
