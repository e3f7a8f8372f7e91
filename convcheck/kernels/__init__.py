"""Pure-torch kernels that stand in for missing compiled ones (same function, no patching)."""
