"""Every supported model architecture, one module per family, and the lookups the registries and oracles read.

A new architecture is a module here (its HF class names and model_type, explicit-mapping rules, config table and
tiny fixtures, as an `Architecture`) plus one entry in SUPPORTED.
"""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from convcheck.models import (
    deepseek,
    dense,
    gemma3,
    gemma3_vl,
    gemma4,
    gemma4_vl,
    glm,
    glm5,
    glm45,
    gpt_oss,
    minimax_m2,
    mistral,
    nemotron_h,
    olmoe,
    qwen3_moe,
    qwen3_vl,
    qwen35_vl,
    qwen_next,
)
from convcheck.models.architecture import Architecture, unique_index
from convcheck.models.bridge_wide import BRIDGE_WIDE
from convcheck.models.config_rules import FieldRule
from convcheck.models.engine_bugs import ENGINE_BUGS
from convcheck.models.fixture_spec import FixtureSpec
from convcheck.models.registered_bugs import REGISTERED_BUGS
from convcheck.models.te_spec_bugs import TE_SPEC_BUGS
from convcheck.models.upstream_bug import UpstreamBug
from convcheck.verdict import OracleVerdict

SUPPORTED: tuple[Architecture, ...] = (
    dense.QWEN2,
    dense.QWEN3,
    qwen3_moe.QWEN3_MOE,
    dense.LLAMA,
    mistral.MISTRAL,
    nemotron_h.NEMOTRON_H,
    deepseek.DEEPSEEK_V3,
    glm.GLM47_FLASH,
    glm45.GLM45,
    glm5.GLM5,
    qwen_next.QWEN3_NEXT,
    qwen_next.QWEN35,
    qwen_next.QWEN35_MOE,
    gpt_oss.GPT_OSS,
    olmoe.OLMOE,
    gemma3.GEMMA3,
    gemma4.GEMMA4,
    minimax_m2.MINIMAX_M2,
    qwen3_vl.QWEN3_VL,
    qwen3_vl.QWEN3_VL_MOE,
    qwen35_vl.QWEN35_VL,
    qwen35_vl.QWEN35_VL_MOE,
    gemma4_vl.GEMMA4_VL,
    gemma3_vl.GEMMA3_VL,
)
"""Every supported architecture; config tables and `tiny:` fixtures are listed in this order."""

BY_HF_CLASS: dict[str, Architecture] = unique_index(
    ((hf_class, arch) for arch in SUPPORTED for hf_class in arch.hf_classes), "HF architecture class"
)
"""HF `architectures` class name -> its architecture (the explicit-mapping registry's lookup)."""
BY_MODEL_TYPE: dict[str, Architecture] = unique_index(((arch.model_type, arch) for arch in SUPPORTED), "model_type")
"""HF `model_type` -> its architecture (the config oracle's lookup)."""
TABLES: dict[str, tuple[FieldRule, ...]] = {model_type: arch.config_rules for model_type, arch in BY_MODEL_TYPE.items()}
"""model_type -> config-table rules."""
FIXTURES: dict[str, FixtureSpec] = unique_index(
    ((spec.name, spec) for arch in SUPPORTED for spec in arch.fixtures), "fixture name"
)
"""Fixture name (after `tiny:`) -> spec, in listing order."""


UPSTREAM_BUG = "upstream_bug"
"""Finding.detail key naming the known megatron-bridge bug (UpstreamBug.name) that explains the finding."""


def tag_upstream_bugs(
    architecture: str,
    bridge_version: str,
    verdicts: Sequence[OracleVerdict],
    versions: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
    already: Sequence[str] = (),
) -> tuple[tuple[OracleVerdict, ...], list[str]]:
    """Tag each finding a known bug of `architecture`'s family, of the bridge's conversion core (seen in
    `bridge_version`) or of a rollout engine (seen in its version among `versions`) explains; one line per bug that
    explains any; `config` (the checkpoint's config.json) leaves out the bugs of another variant
    (UpstreamBug.config_holds); `already` names bugs that explained findings not passed here (a table's row being
    re-tagged), so their consequences are tagged too. Verdicts keep every finding: a known bug still fails."""
    family = BY_HF_CLASS.get(architecture)
    own = (
        family.upstream_bugs
        if family
        else (*TE_SPEC_BUGS.get(architecture, ()), *REGISTERED_BUGS.get(architecture, ()))
    )
    bugs = tuple(b for b in (*own, *BRIDGE_WIDE, *ENGINE_BUGS) if b.applies_to(config))
    others = dict(versions or {})

    def version(bug: UpstreamBug) -> str:
        return bridge_version if bug.project == "megatron-bridge" else others.get(bug.project, "")

    direct = {(i, j): next((b for b in bugs if b.explains(version(b), v.name, f.tensor, f.kind, f.message)), None)
              for i, v in enumerate(verdicts) for j, f in enumerate(v.findings)}  # fmt: skip
    seen = [b for b in bugs if b.name in already or any(d is b for d in direct.values())]
    counts: dict[str, int] = {}
    out = []
    for i, verdict in enumerate(verdicts):
        findings = []
        for j, f in enumerate(verdict.findings):
            bug = direct[(i, j)] or next(
                (b for b in seen if b.explains_consequence(version(b), verdict.name, f.tensor, f.kind)), None
            )
            if bug is not None:
                counts[bug.name] = counts.get(bug.name, 0) + 1
                f = replace(f, detail={**f.detail, UPSTREAM_BUG: bug.name})
            findings.append(f)
        out.append(replace(verdict, findings=tuple(findings)))
    first = {b.name: b for b in reversed(bugs)}  # one line per name: a bug may be stated twice (as two oracles see it)
    return tuple(out), [b.line(counts[b.name]) for b in bugs if b.name in counts and first[b.name] is b]


__all__ = [
    "UPSTREAM_BUG",
    "tag_upstream_bugs",
    "UpstreamBug",
    "BY_HF_CLASS",
    "BY_MODEL_TYPE",
    "FIXTURES",
    "SUPPORTED",
    "TABLES",
    "Architecture",
]
