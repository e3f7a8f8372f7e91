"""`--hook` for tests/test_mapping_batches.py: shrink the mapping oracle's gather budget in every rank."""


def one_byte() -> None:
    """Every parameter's shards go to rank 0 in a gather of their own."""
    import convcheck.oracles.mapping as mapping

    mapping.GATHER_BYTES = 1
