"""Planted conversion bugs: hooks that patch the real bridge / megatron-core classes at run time, in every rank.

`convcheck verify --hook convcheck.mutants.bridge:swap_qk_head0` runs one; nothing is changed on disk.
"""
