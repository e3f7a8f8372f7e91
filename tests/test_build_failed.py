"""A bridge whose provider or model build raises on a valid checkpoint and layout is a bridge bug: every oracle fails
on one `<build>` finding naming the exception and where it was raised, exit 1, never bad input (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import run_cli

HOOK = f"{Path(__file__).parent / 'support' / 'hooks_build.py'}:provider_reads_a_missing_field"


@pytest.mark.ranks
def test_a_provider_that_raises_is_a_finding_of_every_oracle(tmp_path: Path) -> None:
    res = run_cli("verify", "--model", "tiny:qwen3", "--tp", "2", "--oracle", "coverage,roundtrip", "--hook", HOOK,
                  tmp_path=tmp_path)  # fmt: skip
    assert res.code == 1, res.out + res.err
    assert res.verdicts() == {"coverage": "fail", "roundtrip": "fail"}
    findings = res.findings()
    assert [(f["tensor"], f["kind"]) for f in findings] == [("<build>", "build-failed")] * 2
    message = findings[0]["message"]
    assert message.startswith("the bridge's provider or model build raised rank 0: AttributeError: ")
    assert "full_attention_interval" in message and "hooks_build.py:" in message and "(and 1 more rank(s))" in message
