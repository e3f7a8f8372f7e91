"""`--hook`s for tests/test_mappings_gdn.py: bugs planted in the real bridge's GDN conversions, made identically in
import and export (roundtrip cannot see them; the mapping oracle must)."""


def in_proj_ba_swapped() -> None:
    """merge_gdn_linear_weights stores each key head's a rows where its b rows belong and split_gdn_linear_weights
    reads them back from there: Megatron's in_proj holds alpha in the beta section and beta in the alpha section."""
    from megatron.bridge.models.conversion import param_mapping

    merge, split = param_mapping.merge_gdn_linear_weights, param_mapping.split_gdn_linear_weights

    def swap(provider, ba):  # type: ignore[no-untyped-def]
        r = provider.linear_num_value_heads // provider.linear_num_key_heads
        grouped = ba.reshape(provider.linear_num_key_heads, 2, r, -1)
        return grouped.flip(1).reshape(ba.shape)  # per key head [b_group; a_group] -> [a_group; b_group]

    def merge_swapped(provider, qkvz, ba, tp_size=1):  # type: ignore[no-untyped-def]
        return merge(provider, qkvz, swap(provider, ba), tp_size=tp_size)

    def split_swapped(provider, in_proj, tp_size=1, feature_dim=None):  # type: ignore[no-untyped-def]
        qkvz, ba = split(provider, in_proj, tp_size=tp_size, feature_dim=feature_dim)
        return qkvz, swap(provider, ba)

    param_mapping.merge_gdn_linear_weights = merge_swapped
    param_mapping.split_gdn_linear_weights = split_swapped


def conv1d_qk_swapped() -> None:
    """GDNConv1dMapping's channel index lists name k's channels as q's and q's as k's, on import and export: the
    conv1d shard holds k's filters first."""
    from megatron.bridge.models.conversion.param_mapping import GDNConv1dMapping

    original = GDNConv1dMapping.get_shard_idx

    def get_shard_idx(self, config, local_tp):  # type: ignore[no-untyped-def]
        q, k, v = original(self, config, local_tp)
        return [k, q, v]

    GDNConv1dMapping.get_shard_idx = get_shard_idx
