"""Config oracle: the table, uncovered fields, and planted config bugs named by field through the real bridge."""

from pathlib import Path

import pytest

from convcheck.models import TABLES
from convcheck.models.config_rules import Coverage, FieldRule
from convcheck.models.dense import QWEN3_TABLE as QWEN3
from convcheck.oracles.config import check_rule, flatten, uncovered
from tests.support.helpers import matrix_run, mutant, run_cli


def _view(**overrides):  # type: ignore[no-untyped-def]
    import transformers

    cls = transformers.Qwen3Config
    source, defaults = flatten(cls(**overrides).to_dict()), flatten(cls().to_dict())
    return source, defaults, {**defaults, **source}


def test_every_table_rule_has_a_unique_megatron_field_and_label() -> None:
    for model_type, rules in TABLES.items():
        labels = [r.label for r in rules]
        assert len(labels) == len(set(labels)), model_type
        assert all(isinstance(r, FieldRule) for r in rules)


def test_uncovered_field_that_differs_from_default_is_a_finding() -> None:
    source, defaults, _ = _view(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}, foo_bar=3)
    found = {f.tensor: f for f in uncovered(source, defaults, Coverage(rules=QWEN3))}
    assert "foo_bar" in found
    assert not {"rope_parameters.factor", "rope_parameters.rope_theta", "rope_parameters.rope_type"} & set(found)
    assert found["foo_bar"].kind == "uncovered" and "3" in found["foo_bar"].message


def test_unsupported_rope_type_and_sliding_window_are_mismatches() -> None:
    rope = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}
    _, _, view = _view(rope_parameters=rope, use_sliding_window=True)
    megatron = {"position_embedding_type": "rope", "window_size": None, "seq_len_interpolation_factor": None}
    rules = {r.megatron: r for r in QWEN3}
    for field in ("position_embedding_type", "window_size"):
        finding = check_rule(rules[field], view, megatron.__getitem__)
        assert finding is not None and finding.kind == "mismatch" and "not representable" in finding.message, field


def test_linear_rope_scaling_needs_the_interpolation_factor() -> None:
    """Linear RoPE scaling (Megatron-Bridge <= 0.5.1 dropped it, #5097): positions divided by the factor."""
    _, _, view = _view(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4})
    rule = next(r for r in QWEN3 if r.megatron == "position_embedding_type")
    dropped = {"position_embedding_type": "rope", "seq_len_interpolation_factor": None}
    finding = check_rule(rule, view, dropped.__getitem__)
    assert finding is not None and finding.kind == "mismatch"
    assert "'rope / 4.0'" in finding.message and "seq_len_interpolation_factor" in finding.message
    kept = {**dropped, "seq_len_interpolation_factor": 4.0}
    assert check_rule(rule, view, kept.__getitem__) is None
    _, _, plain = _view()
    assert check_rule(rule, plain, dropped.__getitem__) is None
    assert check_rule(rule, plain, kept.__getitem__) is not None


def test_bool_is_not_equal_to_int() -> None:
    rule = next(r for r in QWEN3 if r.megatron == "qk_layernorm")
    assert check_rule(rule, {}, {"qk_layernorm": 1}.__getitem__) is not None
    assert check_rule(rule, {}, {"qk_layernorm": True}.__getitem__) is None


@pytest.mark.ranks
@pytest.mark.parametrize(
    "model,layout",
    [("qwen3", ()), ("qwen3-moe", ("--ep", "2"))],
    ids=["qwen3-TP1", "qwen3-moe-EP2"],
)
def test_config_and_logits_pass(shared_root: Path, model: str, layout: tuple[str, ...]) -> None:
    res, _ = matrix_run(shared_root, model, layout)  # the verify-matrix run of this case: every default oracle
    assert res.code == 0, res.out + res.err
    assert res.verdicts()["config"] == "pass" and res.verdicts()["logits"] == "pass"
    config = next(o for o in res.report["oracles"] if o["name"] == "config")
    assert config["unit"] == "fields" and config["metrics"]["rules"] >= 28 and config["metrics"]["roundtrip_rules"] > 0


PLANTED = [
    ("wrong_rope_theta", "tiny:qwen3", "rope_parameters.rope_theta -> rotary_base"),
    ("eps_off", "tiny:qwen3", "rms_norm_eps -> layernorm_epsilon"),
    ("drop_qk_norm", "tiny:qwen3", "<implied> -> qk_layernorm"),
    ("router_topk", "tiny:qwen3-moe", "num_experts_per_tok -> moe_router_topk"),
    ("flip_tied", "tiny:qwen3", "tie_word_embeddings -> share_embeddings_and_output_weights"),
]


@pytest.mark.ranks
@pytest.mark.parametrize("plant,model,label", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_config_bug_is_named_by_field(tmp_path: Path, plant: str, model: str, label: str) -> None:
    hook = ("--hook", mutant("config", plant))
    res = run_cli("verify", "--oracle", "config,logits", "--model", model, *hook, tmp_path=tmp_path)
    assert res.code == 1, res.out + res.err
    findings = {f["tensor"]: f for f in res.findings("config")}
    assert label in findings, sorted(findings)
    assert findings[label]["kind"] == "mismatch"
    assert {f["kind"] for f in res.findings("config")} <= {"mismatch", "roundtrip-mismatch"}
    assert res.verdicts()["logits"] == "fail", "the planted field must also change the logits"
    assert label.rpartition(" -> ")[2] in res.out


def test_qk_norms_are_read_from_the_built_layers_not_the_flag() -> None:
    """Gemma 3 / MiniMax-M2: the rule holds when every built attention layer has a q and a k norm, whatever the
    qk_layernorm flag says (bridge 0.4.x builds MiniMax-M2's norms from its own spec with the flag off); a layer whose
    k norm is missing fails, naming the rule."""
    import torch

    from convcheck.models.config_rules import built_qk_norms
    from convcheck.oracles.config import _walk

    def model(k_norm_in_layer_1: bool) -> torch.nn.Module:
        layers = torch.nn.ModuleList()
        for index in range(2):
            attention = torch.nn.Module()
            attention.q_layernorm = torch.nn.LayerNorm(4)
            attention.k_layernorm = torch.nn.LayerNorm(4) if index == 0 or k_norm_in_layer_1 else None
            layer = torch.nn.Module()
            layer.self_attention = attention
            layers.append(layer)
        root, root.decoder = torch.nn.Module(), torch.nn.Module()
        root.decoder.layers = layers
        return root

    rule = built_qk_norms("q_norm / k_norm in every layer")
    for built, verdict in ((model(True), None), (model(False), "mismatch")):
        get = lambda name, built=built: _walk(built, name[len("model.") :], name)  # noqa: E731
        finding = check_rule(rule, {}, get)
        assert (finding.kind if finding else None) == verdict
    assert finding is not None and finding.tensor == "<implied> -> model.decoder.layers.*.self_attention.q_layernorm"
