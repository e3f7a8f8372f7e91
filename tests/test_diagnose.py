"""diagnose: named rearrangements from plain tensors (fast, no distributed)."""

from __future__ import annotations

import torch

from convcheck.compare.diagnose import SiblingIndex, _strip_digits, diagnose, sibling_names
from convcheck.fixtures.values import distinct_values

Q = "model.layers.0.self_attn.q_proj.weight"
K = "model.layers.0.self_attn.k_proj.weight"
GATE = "model.layers.0.mlp.gate_proj.weight"
UP = "model.layers.0.mlp.up_proj.weight"


def _t(shape: tuple[int, ...], name: str) -> torch.Tensor:
    return distinct_values(shape, name, 7, torch.bfloat16)


def test_identical_is_not_diagnosed() -> None:
    x = _t((8, 4), Q)
    assert diagnose(Q, x, x.clone()) is None


def test_transpose() -> None:
    x = _t((8, 6), Q)
    d = diagnose(Q, x, x.t().contiguous())
    assert d is not None and d.kind == "transpose"


def test_square_transpose() -> None:
    x = _t((8, 8), Q)
    d = diagnose(Q, x, x.t().contiguous())
    assert d is not None and d.kind == "transpose"


def test_tp_block_reorder_dim0() -> None:
    x = _t((16, 4), Q)
    d = diagnose(Q, x, torch.cat([x[8:], x[:8]]))
    assert d is not None and d.kind == "block-reorder" and "[1, 0]" in d.text and "TP" in d.text
    d4 = diagnose(Q, x, torch.cat([x[4:8], x[8:12], x[:4], x[12:]]))
    assert d4 is not None and d4.kind == "block-reorder" and "[1, 2, 0, 3]" in d4.text


def test_block_reorder_dim1() -> None:
    x = _t((4, 16), "o_proj")
    d = diagnose("o_proj", x, torch.cat([x[:, 8:], x[:, :8]], dim=1))
    assert d is not None and d.kind == "block-reorder" and "columns" in d.text


def test_head_swap() -> None:
    x = _t((32, 4), Q)
    y = x.clone()
    y[8:16], y[16:24] = x[16:24], x[8:16]
    d = diagnose(Q, x, y)
    assert d is not None and d.kind == "block-swap" and "8:16 <-> 16:24" in d.text


def test_qk_swap_for_one_group() -> None:
    q, k = _t((32, 4), Q), _t((16, 4), K)
    y = q.clone()
    y[:8] = k[:8]
    d = diagnose(Q, q, y, {K: k})
    assert d is not None and d.kind == "mixed-sources" and "q/k swap" in d.text and K in d.text


def test_gate_up_halves_swapped() -> None:
    g, u = _t((16, 4), GATE), _t((16, 4), UP)
    y = torch.cat([g[:8], u[:8]])
    d = diagnose(GATE, g, y, {UP: u})
    assert d is not None and "gate/up" in d.text and "8:16" in d.text


def test_expert_renumbering() -> None:
    e0, e4 = "m.layers.1.mlp.experts.0.up_proj.weight", "m.layers.1.mlp.experts.4.up_proj.weight"
    a, b = _t((8, 4), e0), _t((8, 4), e4)
    d = diagnose(e0, a, b.clone(), {e4: b})
    assert d is not None and d.kind == "renumbered" and e4 in d.text


def test_rows_dropped_and_padded() -> None:
    x = _t((152, 4), "embed")
    d = diagnose("embed", x, x[:144].clone())
    assert d is not None and d.kind == "dropped" and "8 rows dropped" in d.text
    p = diagnose("embed", x, torch.cat([x, torch.zeros(8, 4, dtype=x.dtype)]))
    assert p is not None and p.kind == "padded"


def test_one_dim() -> None:
    x = _t((32,), "norm")
    d = diagnose("norm", x, torch.cat([x[16:], x[:16]]))
    assert d is not None and d.kind == "block-reorder"


def test_unexplained_returns_none() -> None:
    x = _t((8, 4), Q)
    y = x.clone()
    y[3, 2] = 0.0
    assert diagnose(Q, x, y) is None


def test_sibling_names() -> None:
    names = [Q, K, GATE, UP, "m.layers.1.mlp.experts.4.up_proj.weight", "m.layers.1.mlp.experts.0.up_proj.weight"]
    assert K in sibling_names(Q, names)
    assert "m.layers.1.mlp.experts.4.up_proj.weight" in sibling_names("m.layers.1.mlp.experts.0.up_proj.weight", names)


def _brute_siblings(name: str, names: list[str], limit: int) -> list[str]:
    """The definition: every other name of the same module or the same digit-free pattern, sorted, first `limit`."""
    parent, pattern = name.rsplit(".", 2)[0], _strip_digits(name)
    out = [n for n in names if n != name and (n.rsplit(".", 2)[0] == parent or _strip_digits(n) == pattern)]
    return sorted(out)[:limit]


def test_sibling_index_equals_the_full_scan_for_every_name() -> None:
    names = [f"m.layers.{i}.mlp.experts.{e}.{p}_proj.weight" for i in range(3) for e in range(40) for p in "gud"]
    names += [f"m.layers.{i}.self_attn.{p}_proj.weight" for i in range(3) for p in "qkvo"] + ["m.norm.weight"]
    index = SiblingIndex(names)
    for limit in (1, 5, 32):
        for name in names[::7] + ["m.layers.9.self_attn.q_proj.weight"]:
            assert index.siblings(name, limit) == _brute_siblings(name, names, limit), (name, limit)
