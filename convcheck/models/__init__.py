"""Every supported model architecture, one module per family, and the lookups the registries and oracles read.

A new architecture is a module here (its HF class names and model_type, explicit-mapping rules, config table and
tiny fixtures, as an `Architecture`) plus one entry in SUPPORTED.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from convcheck.errors import NotCovered
from convcheck.hf.geometry import Geometry
from convcheck.mappings import MappingRegistry, registry_from_rules
from convcheck.models import (
    deepseek,
    dense,
    glm,
    glm45,
    gpt_oss,
    mistral,
    nemotron_h,
    olmoe,
    qwen3_moe,
    qwen3_vl,
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
    qwen_next.QWEN3_NEXT,
    qwen_next.QWEN35,
    qwen_next.QWEN35_MOE,
    gpt_oss.GPT_OSS,
    olmoe.OLMOE,
    qwen3_vl.QWEN3_VL,
    qwen3_vl.QWEN3_VL_MOE,
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


def build_registry(
    architecture: str,
    geometry: Geometry,
    megatron_names: Iterable[str],
    hf_names: Iterable[str],
    *,
    tied: bool = False,
    strict: bool = True,
) -> MappingRegistry:
    """The explicit-mapping registry of HF class `architecture`: every Megatron name mapped once by its family's rules;
    strict: CoverageError names every unmapped or doubly mapped parameter and every HF tensor produced 0 or 2+ times."""
    family = BY_HF_CLASS.get(architecture)
    if family is None or family.mapping_rules is None:
        mapped = sorted(name for name, arch in BY_HF_CLASS.items() if arch.mapping_rules is not None)
        raise NotCovered(f"convcheck has no explicit mappings for {architecture} (it has them for {', '.join(mapped)})")
    rules = family.mapping_rules(tied)
    return registry_from_rules(architecture, rules, geometry, megatron_names, hf_names, tied=tied, strict=strict)


UPSTREAM_BUG = "upstream_bug"
"""Finding.detail key naming the known megatron-bridge bug (UpstreamBug.name) that explains the finding."""


def tag_upstream_bugs(
    architecture: str,
    bridge_version: str,
    verdicts: Sequence[OracleVerdict],
    versions: Mapping[str, str] | None = None,
) -> tuple[tuple[OracleVerdict, ...], list[str]]:
    """Tag each finding a known bug of `architecture`'s family, of the bridge's conversion core (seen in
    `bridge_version`) or of a rollout engine (seen in its version among `versions`) explains; one line per bug that
    explains any. Verdicts keep every finding: a known bug still fails."""
    family = BY_HF_CLASS.get(architecture)
    own = (
        family.upstream_bugs
        if family
        else (*TE_SPEC_BUGS.get(architecture, ()), *REGISTERED_BUGS.get(architecture, ()))
    )
    bugs: tuple[UpstreamBug, ...] = (*own, *BRIDGE_WIDE, *ENGINE_BUGS)
    others = dict(versions or {})
    counts: dict[str, int] = {}
    out = []
    for verdict in verdicts:
        findings = []
        for f in verdict.findings:
            bug = next(
                (b for b in bugs if b.explains(bridge_version if b.project == "megatron-bridge" else
                                               others.get(b.project, ""), verdict.name, f.tensor, f.kind)),
                None,
            )  # fmt: skip
            if bug is not None:
                counts[bug.name] = counts.get(bug.name, 0) + 1
                f = replace(f, detail={**f.detail, UPSTREAM_BUG: bug.name})
            findings.append(f)
        out.append(replace(verdict, findings=tuple(findings)))
    return tuple(out), [b.line(counts[b.name]) for b in bugs if b.name in counts]


__all__ = [
    "UPSTREAM_BUG",
    "tag_upstream_bugs",
    "UpstreamBug",
    "BY_HF_CLASS",
    "build_registry",
    "BY_MODEL_TYPE",
    "FIXTURES",
    "SUPPORTED",
    "TABLES",
    "Architecture",
]
