"""`--hook`s for tests/test_from_config.py: rope settings the bridge could get wrong, planted on its real provider."""

from convcheck.mutants.patch import alter_provider


def llama3_factor_halved() -> None:
    """Llama-3 frequency scaling with half the HF factor (8 -> 4)."""
    alter_provider(lambda p: setattr(p, "rope_scaling_factor", p.rope_scaling_factor / 2) if p.rope_scaling else None)


def mla_yarn_left_at_megatron_default() -> None:
    """An MLA model without rope scaling left at MLATransformerConfig's DeepSeek-V3 Yarn factor 40, the default
    megatron-bridge overrides with 1 (conversion/model_bridge.py:610-613)."""
    alter_provider(lambda p: setattr(p, "rotary_scaling_factor", 40.0) if p.multi_latent_attention else None)
