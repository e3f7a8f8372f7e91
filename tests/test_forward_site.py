"""The logits oracle names a forward that raises by the innermost open module holding parameters (forward_site)."""

from __future__ import annotations

import pytest

from convcheck.oracles.forward_site import tracking


def test_a_raising_forward_is_named_by_the_module_it_raised_in() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.LayerNorm(5)))
    with tracking([model], lambda name, vp: f"chunk{vp}.{name}") as site:
        with pytest.raises(RuntimeError):
            model(torch.ones(2, 4))
        where = site()
    assert where is not None
    assert (where.module, where.kind, where.tensor) == ("chunk0.1.1", "LayerNorm", "chunk0.1.1.weight")
    assert where.params == {"chunk0.1.1.weight": [5], "chunk0.1.1.bias": [5]}
    assert where.inputs == [[2, 6]]
    assert "inside LayerNorm chunk0.1.1 (weight [5], bias [5]) called on input [2, 6]" == where.describe()


def test_a_forward_that_returns_leaves_no_site_and_no_hooks() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with tracking([model], lambda name, vp: name) as site:
        model(torch.ones(1, 4))
        assert site() is None
    assert not torch.nn.modules.module._global_forward_pre_hooks
