"""`--hook`s for tests/test_multinode.py: a planted bug that only some cases of one gate run meet."""

from convcheck.mutants.bridge import swap_qk_head0


def swap_qk_head0_without_tp() -> None:
    """The q/k head-0 swap of convcheck.mutants.bridge, planted only where TP is 1 (a gate's pp2 case, not tp2)."""
    from megatron.core import parallel_state

    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        swap_qk_head0()
