"""Config oracle: the Megatron config the bridge derived matches the HF config, field by field, both ways."""

from __future__ import annotations

from typing import Any

import transformers

from convcheck.models import TABLES
from convcheck.models.config_rules import REQUIRED, Coverage, FieldRule, HfView
from convcheck.oracles import ORACLES
from convcheck.rank.context import RankContext
from convcheck.verdict import Finding, OracleVerdict, make_verdict

NAME = "config"
INFO = ORACLES[NAME]
_ABSENT = "<absent>"


def flatten(config: dict[str, Any]) -> dict[str, Any]:
    """One level of nesting spelled with dots: {"rope_parameters": {"rope_theta": 1}} -> rope_parameters.rope_theta."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and key not in ("id2label", "label2id"):
            out.update({f"{key}.{sub}": v for sub, v in value.items()})
            if not value:
                out[key] = value
        else:
            out[key] = value
    return out


def same_value(a: Any, b: Any) -> bool:
    """Equality that does not let True pass for 1 (or 1.0 for True)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _walk(owner: Any, path: str, name: str) -> Any:
    """Follow a dotted attribute path; a `*` segment fans out over a sequence, keeping the items that have the rest."""
    head, _, rest = path.partition(".")
    if head == "*":
        return [_walk(item, rest, name) for item in owner if not rest or hasattr(item, rest.partition(".")[0])]
    if not hasattr(owner, head):
        raise AttributeError(name)
    return _walk(getattr(owner, head), rest, name) if rest else getattr(owner, head)


def megatron_getter(ctx: RankContext) -> Any:
    """`get(name)`: a TransformerConfig attribute of the built model, or `model.PATH` of its first chunk.

    PATH is dotted; `*` maps over a module list (`model.decoder.layers.*.mixer.d_conv`: every local layer's mixer).
    """
    chunk = ctx.model[0]
    config = chunk.config
    while hasattr(chunk, "module"):
        chunk = chunk.module

    def get(name: str) -> Any:
        if name.startswith("model."):
            return _walk(chunk, name[len("model.") :], name)
        if not hasattr(config, name):
            raise AttributeError(name)
        return getattr(config, name)

    return get


def _read(rule: FieldRule, get: Any) -> Any:
    """The rule's Megatron field; `rule.missing` where the config lacks the field and the rule says what that means."""
    try:
        return get(rule.megatron)
    except AttributeError:
        if rule.missing is REQUIRED:
            raise
        return rule.missing


def check_rule(rule: FieldRule, hf: HfView, get: Any) -> Finding | None:
    """None when the Megatron field holds what the HF fields require; else a finding naming both sides."""
    hf_values = {f: hf.get(f, _ABSENT) for f in rule.hf}
    try:
        expected = rule.expect(hf, get)
        actual = rule.observe(_read(rule, get), get)
    except (AttributeError, KeyError, TypeError) as exc:
        return Finding(
            tensor=rule.label,
            kind="unreadable",
            message=f"cannot evaluate the rule: {exc.__class__.__name__}: {exc}",
            detail={"hf": hf_values},
        )
    if same_value(expected, actual):
        return None
    shown = ", ".join(f"{k}={v!r}" for k, v in hf_values.items()) or "the architecture"
    return Finding(
        tensor=rule.label,
        kind="mismatch",
        message=f"{shown} requires {rule.megatron}={expected!r}; the Megatron config has {actual!r}"
        + (f" ({rule.note})" if rule.note else ""),
        detail={"hf": hf_values, "megatron_field": rule.megatron, "expected": repr(expected), "actual": repr(actual)},
    )


def uncovered(source: dict[str, Any], defaults: dict[str, Any], coverage: Coverage) -> list[Finding]:
    """HF fields whose value differs from the config class default and that no rule or ignore entry names."""
    findings = []
    for key in sorted(source):
        if same_value(source[key], defaults.get(key, _ABSENT)) or coverage.covers(key):
            continue
        findings.append(
            Finding(
                tensor=key,
                kind="uncovered",
                message=f"HF config sets {key}={source[key]!r} (class default {defaults.get(key, _ABSENT)!r}) "
                "and no rule of the config table says what Megatron must do with it",
                detail={"value": repr(source[key]), "default": repr(defaults.get(key, _ABSENT))},
            )
        )
    return findings


def roundtrip(
    ctx: RankContext, hf_cls: type, rules: tuple[FieldRule, ...], hf: HfView, get: Any
) -> tuple[int, list[Finding]]:
    """Provider -> the bridge's megatron_to_hf_config -> HF config class: every covered rule must agree."""
    model_bridge = ctx.bridge._model_bridge
    if not hasattr(type(model_bridge), "megatron_to_hf_config"):  # megatron-bridge 0.3.0
        from importlib import metadata

        message = f"megatron-bridge {metadata.version('megatron-bridge')} has no megatron_to_hf_config to check"
        return 0, [Finding(tensor="<megatron_to_hf_config>", kind="not-supported", message=message)]
    try:
        exported = type(model_bridge).megatron_to_hf_config(ctx.provider)
        back = hf_cls(**exported)
    except Exception as exc:  # noqa: BLE001 - a crashing export is a finding
        message = f"raised {exc.__class__.__name__}: {exc}"
        return 0, [Finding(tensor="<megatron_to_hf_config>", kind="roundtrip-failed", message=message)]
    defaults = flatten(hf_cls().to_dict())
    view = {**defaults, **flatten(back.to_dict())}
    findings, checked = [], 0
    for rule in rules:
        if not rule.hf:
            continue
        checked += 1
        try:
            want, got = rule.expect(hf, get), rule.expect(view, get)
        except (KeyError, TypeError) as exc:
            want, got = "<source>", f"<unreadable: {exc.__class__.__name__}: {exc}>"
        if not same_value(want, got):
            fields = {f: (hf.get(f, _ABSENT), view.get(f, _ABSENT)) for f in rule.hf}
            shown = ", ".join(f"{k}: source {a!r}, exported {b!r}" for k, (a, b) in fields.items())
            if all(same_value(a, b) for a, b in fields.values()):  # the difference is in a field read via `also`
                shown += f"; as {rule.megatron}: source {want!r}, exported {got!r}"
            findings.append(
                Finding(
                    tensor=f"{'+'.join(rule.hf)} (megatron_to_hf_config)",
                    kind="roundtrip-mismatch",
                    message=f"{type(model_bridge).__name__}.megatron_to_hf_config gives {shown}",
                    detail={"megatron_field": rule.megatron, "source": repr(want), "exported": repr(got)},
                )
            )
    return checked, findings


def run(ctx: RankContext) -> OracleVerdict | None:
    """Rank 0 compares; the others have nothing to add (every rank holds the same config)."""
    if not ctx.is_reporter:
        return None

    hf_config = transformers.AutoConfig.from_pretrained(ctx.checkpoint.path)
    hf_cls = type(hf_config)
    source, defaults = flatten(hf_config.to_dict()), flatten(hf_cls().to_dict())
    view = {**defaults, **source}
    model_type = getattr(hf_config, "model_type", "?")
    rules = TABLES.get(model_type, ())
    if not rules:  # a family convcheck has no config table for: nothing to say about any field
        known = ", ".join(t for t, r in TABLES.items() if r)
        reason = f"convcheck has no config table for model_type {model_type!r} (it has them for {known})"
        return make_verdict(NAME, checked=0, findings=[], unit="fields", not_covered=reason,
                            metrics={"rules": 0, "hf_fields": len(source)})  # fmt: skip
    findings: list[Finding] = []
    get = megatron_getter(ctx)
    active = tuple(r for r in rules if r.when is None or r.when(view))  # the other variant's rules check nothing here
    findings += [f for f in (check_rule(r, view, get) for r in active) if f is not None]
    findings += uncovered(source, defaults, Coverage(rules=rules))
    rt_checked, rt_findings = roundtrip(ctx, hf_cls, active, view, get) if active else (0, [])
    findings += rt_findings
    metrics = {"rules": len(active), "hf_fields": len(source), "roundtrip_rules": rt_checked}
    return make_verdict(NAME, checked=len(active) + rt_checked, findings=findings, unit="fields", metrics=metrics)
