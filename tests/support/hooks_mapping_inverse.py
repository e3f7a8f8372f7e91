"""`--hook` for tests/test_mapping_oracle.py: the bridge's export and convcheck's own from_shards share one bug."""


def transposed_o_proj_both() -> None:
    """The bridge exports layer 0's o_proj transposed (a real planted export bug), and the explicit Split mapping's
    from_shards transposes it too, while its to_shard stays right: a mapping that is not to_shard's inverse."""
    import convcheck.mappings.simple as simple
    from convcheck.mutants.bridge import transpose_o_proj

    transpose_o_proj()
    original = simple.Split.from_shards

    def from_shards(self, shards, layout):  # type: ignore[no-untyped-def]
        for name, tensor in original(self, shards, layout):
            yield name, (tensor.t().contiguous() if name == "model.layers.0.self_attn.o_proj.weight" else tensor)

    simple.Split.from_shards = from_shards
