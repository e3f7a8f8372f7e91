"""UpstreamBug: a real megatron-bridge conversion bug convcheck names, as data (no torch).

A finding it explains stays a finding and the verdict stays FAIL; the finding is tagged with the bug's name, the run
prints one line naming the bug and where it lives upstream, and `convcheck selftest` neither counts it as a false
alarm of a clean run nor credits it to a planted bug.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class UpstreamBug:
    """One megatron-bridge bug: the findings it causes, where it lives, the releases it was seen in."""

    name: str
    """Short id, e.g. `deepseek-yarn-dropped`."""
    summary: str
    """One line: what the bridge does wrong."""
    where: str
    """Upstream file:line (megatron-bridge unless said otherwise) of the faulty code."""
    findings: tuple[tuple[str, str, str], ...]
    """(oracle, tensor, finding kind) of every finding it causes; oracle and tensor are fnmatch patterns."""
    seen_in: tuple[str, ...]
    """megatron-bridge releases convcheck ran it on and saw it (a finding on another release is not explained)."""
    fixed_in: str = ""
    """The upstream release or commit that fixes it, when there is one."""
    project: str = "megatron-bridge"
    """Whose bug it is: "megatron-bridge", or a rollout engine ("vllm"); `seen_in` lists that project's versions."""
    consequences: tuple[tuple[str, str, str], ...] = ()
    """(oracle, tensor, finding kind) of findings it causes only through one of `findings` (the logits of a model
    whose embedding the import never wrote): explained only in a run where one of `findings` was explained too."""

    config_holds: tuple[tuple[str, object], ...] = ()
    """(HF config field, value) pairs a run's config.json must hold for the bug to apply: a bug of one variant of an
    architecture (Gemma 4's MoE variant, `enable_moe_block` true; a dotted field in a sub-config,
    `text_config.enable_moe_block`); empty: every config of the architecture."""

    message_contains: str = ""
    """Where set, a finding is explained only when its message holds this text (a build failure, whose oracle, tensor
    and kind every build failure shares, is this bug's only when it names the bug's own error)."""

    def applies_to(self, config: Mapping[str, Any] | None) -> bool:
        """Whether the bug can be a run's with this HF config (None: the config is unknown, so it can); a dotted
        field is read in a nested config (`text_config.enable_moe_block`)."""
        return config is None or all(_field(config, name) == value for name, value in self.config_holds)

    def explains(self, bridge_version: str, oracle: str, tensor: str, kind: str, message: str = "") -> bool:
        return (
            bridge_version in self.seen_in
            and _matches(self.findings, oracle, tensor, kind)
            and self.message_contains in message
        )

    def explains_consequence(self, bridge_version: str, oracle: str, tensor: str, kind: str) -> bool:
        """Whether a finding is one of `consequences` (to tag only beside a finding `explains`)."""
        return bridge_version in self.seen_in and _matches(self.consequences, oracle, tensor, kind)

    def line(self, count: int) -> str:
        fixed = f"; fixed in {self.fixed_in}" if self.fixed_in else "; not fixed upstream yet"
        return f"{count} finding(s) are the known {self.project} bug {self.name}: {self.summary} ({self.where}{fixed})"


def _field(config: Mapping[str, Any], name: str) -> Any:
    """`config[name]`, or for `a.b` `config[a][b]` where config[a] is a dict; None where absent."""
    if name in config or "." not in name:
        return config.get(name)
    head, _, rest = name.partition(".")
    inner = config.get(head)
    return _field(inner, rest) if isinstance(inner, Mapping) else None


def _matches(patterns: tuple[tuple[str, str, str], ...], oracle: str, tensor: str, kind: str) -> bool:
    return any(fnmatchcase(oracle, o) and kind == k and fnmatchcase(tensor, t) for o, t, k in patterns)


EVERY_ORACLE = ("coverage", "roundtrip", "config", "logits", "differential", "elements", "layout", "mapping", "save")
"""The oracles a build failure stops, each with its own `<build> [build-failed]` finding."""

BUILD_FAILED = tuple((oracle, "<build>", "build-failed") for oracle in EVERY_ORACLE)
"""An UpstreamBug's findings when the bridge cannot build the model: every oracle's build failure (name the bug's own
error with `message_contains`)."""

WRONG_DTYPE = (
    ("roundtrip", "*", "dtype"),
    ("layout", "*", "tp1-differs-from-source"),
    ("save", "*", "dtype"),
    ("mapping", "*", "import-dtype"),
)
"""An UpstreamBug's findings when the bridge builds the model in another dtype than the checkpoint's (a dtype read
where the checkpoint does not keep it): every exported tensor's dtype, as roundtrip, layout, save and mapping see it."""
