"""A receiver on rank 0, as the receiver and idempotence oracles drive it: build, fill, sync, read back, compare."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoConfig

from convcheck.compare.bits import compare_bits, count_true, first_true, together, unravel_index
from convcheck.errors import NotCovered, one_line
from convcheck.hf.tensors import TensorReader
from convcheck.sync.adapters import DEFAULT_RECEIVER, label, load_receiver
from convcheck.verdict import Finding


class SourceTensors(Mapping):
    """The source checkpoint as a read-on-access mapping of HF name -> tensor (what `expected(hf)` receives)."""

    def __init__(self, checkpoint: Any) -> None:
        self._reader = TensorReader(checkpoint)
        self._names = sorted(checkpoint.tensors)

    def __getitem__(self, name: str) -> Any:
        if name not in self._reader.checkpoint.tensors:
            raise KeyError(name)
        return self._reader.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def receiver_label(ctx: Any) -> str:
    return label(ctx.sync.receiver or DEFAULT_RECEIVER)


def failed(ctx: Any, what: str, exc: BaseException) -> Finding:
    """The `receiver-failed` finding: the receiver raised while `what`."""
    label = receiver_label(ctx)
    return Finding(
        tensor="<receiver>",
        kind="receiver-failed",
        message=f"receiver {label} raised {one_line(exc)} {what}",
        detail={"receiver": label},
    )


def build(ctx: Any) -> tuple[Any, Finding | None, str | None]:
    """Rank 0: the receiver constructed as CLASS(config=<the checkpoint's transformers config>), or the finding of its
    failure, or why convcheck's own receiver cannot represent this model (NotCovered: the verdict is not-covered)."""
    try:
        cls = load_receiver(ctx.sync.receiver)
        return cls(config=AutoConfig.from_pretrained(str(ctx.checkpoint.path))), None, None
    except NotCovered as exc:
        return None, None, str(exc)
    except Exception as exc:  # noqa: BLE001 - a receiver that cannot be built is a finding
        return None, failed(ctx, "while being constructed", exc), None


def storage(receiver: Any) -> list[tuple[str, Any]]:
    """The receiver's own tensors (named_parameters(), else state_dict()): what the sentinel fill writes."""
    if callable(getattr(receiver, "named_parameters", None)):
        return list(receiver.named_parameters())
    return list(receiver.state_dict().items())


def read_state(receiver: Any) -> dict[str, Any]:
    """The receiver's state as the oracles compare it (state_dict(), else named_parameters())."""
    if callable(getattr(receiver, "state_dict", None)):
        return dict(receiver.state_dict())
    return dict(receiver.named_parameters())


def fill_sentinel(receiver: Any) -> None:
    """NaN into every floating tensor of the receiver, so whatever a sync leaves unwritten shows."""
    with torch.no_grad():
        for _, tensor in storage(receiver):
            if tensor.is_floating_point():
                tensor.data.fill_(float("nan"))


@dataclass
class Delivery:
    """What one sync handed to the receiver."""

    counts: Counter[str] = field(default_factory=Counter)
    failure: Finding | None = None
    kept: list[tuple[str, Any]] = field(default_factory=list)
    """With keep: a copy of every item, taken before the receiver saw it."""
    handed: list[tuple[str, Any]] = field(default_factory=list)
    """With keep: the very objects the receiver was handed."""


def sync(ctx: Any, receiver: Any, keep: bool = False) -> Delivery:
    """Collective: every rank drains ctx.export(); on rank 0 it is fed to one `receiver.load_weights` call."""
    stream = ctx.export()
    delivery = Delivery()
    if receiver is None:
        for _ in stream:
            pass
        return delivery

    def feed() -> Iterator[tuple[str, Any]]:
        for name, tensor in stream:
            delivery.counts[name] += 1
            if keep:
                delivery.kept.append((name, tensor.detach().clone()))
                delivery.handed.append((name, tensor))
            yield name, tensor

    try:
        receiver.load_weights(feed())
    except Exception as exc:  # noqa: BLE001 - a raising receiver is a finding
        last = next(reversed(delivery.counts), None)
        where = f"after {sum(delivery.counts.values())} tensor(s)" + (f" (last: {last})" if last else "")
        delivery.failure = failed(ctx, f"in load_weights {where}", exc)
    for _ in stream:  # what the receiver did not read still has to be drained: the export is collective
        pass
    return delivery


def feeds(receiver: Any, param: str, hf_names: list[str]) -> list[str]:
    """The HF names feeding receiver parameter `param` (the receiver's `sources`, else the name itself)."""
    if callable(getattr(receiver, "sources", None)):
        return list(receiver.sources(param, hf_names))
    return [param]


def origin(receiver: Any, param: str, index: list[int]) -> str:
    """` <- hf_name[i, j]`: where element `index` of `param` comes from (the receiver's `locate`); "" for itself."""
    if not callable(getattr(receiver, "locate", None)):
        return ""
    name, where = receiver.locate(param, tuple(index))
    return "" if name == param else f" <- {name}{list(where)}"


def _names_text(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:3])}, ... ({len(names)} tensors)"


def compare_param(receiver: Any, param: str, actual: Any, expected: Any, hf_names: list[str]) -> Finding | None:
    """None when `actual` is bitwise `expected`; else a finding naming the parameter, its HF sources and the first
    wrong element (`not-written` when it still holds the sentinel)."""
    finding = compare_bits(param, expected, actual)
    if finding is None:
        return None
    actual, expected = together(actual, expected)
    sources = feeds(receiver, param, hf_names)
    fed = f"; fed by {_names_text(sources)}" if sources != [param] else ""
    detail = {**finding.detail, "sources": sources}
    if finding.kind == "bytes-differ" and actual.is_floating_point():
        unset = (actual.isnan() & ~expected.isnan()).reshape(-1)
        if bool(unset.any()):
            first = list(unravel_index(first_true(unset), tuple(actual.shape)))
            count = count_true(unset)
            return Finding(
                tensor=param,
                kind="not-written",
                message=f"{count}/{unset.numel()} elements never written (still the NaN sentinel), first at index "
                f"{first}{origin(receiver, param, first)}{fed}",
                detail={**detail, "count": count, "first_index": first},
            )
    if finding.kind == "bytes-differ":
        first = finding.detail["first_index"]
        source = origin(receiver, param, first)
        message = f"{finding.message}" + (f"; element {first}{source}" if source else "") + fed
    else:
        message = f"{finding.message}{fed}"
    return Finding(tensor=param, kind=finding.kind, message=message, detail=detail)


def compare_state(receiver: Any, state: dict[str, Any], expected: dict[str, Any], hf_names: list[str]) -> list[Finding]:
    """Findings for every receiver parameter that is missing, unexplained by the source, or not bitwise expected."""
    findings = []
    for param in sorted(set(state) | set(expected)):
        if param not in state:
            sources = feeds(receiver, param, hf_names)
            fed = f"; fed by {_names_text(sources)}" if sources != [param] else ""
            findings.append(
                Finding(
                    tensor=param,
                    kind="missing",
                    message=f"the source implies this parameter, the receiver does not hold it{fed}",
                )
            )
        elif param not in expected:
            findings.append(
                Finding(
                    tensor=param,
                    kind="no-source",
                    message="the receiver holds this parameter, the source implies no value for it",
                )
            )
        elif (finding := compare_param(receiver, param, state[param], expected[param], hf_names)) is not None:
            findings.append(finding)
    return findings


def delivery_findings(delivery: Delivery, source: list[str]) -> list[Finding]:
    """HF names the sync delivered more than once, or never."""
    findings = [
        Finding(
            tensor=name,
            kind="delivered-twice",
            message=f"the sender delivered this tensor {count} times",
            detail={"count": count},
        )
        for name, count in sorted(delivery.counts.items())
        if count > 1
    ]
    findings += [
        Finding(tensor=name, kind="not-delivered", message="the sync never delivered this source tensor")
        for name in source
        if name not in delivery.counts
    ]
    return findings
