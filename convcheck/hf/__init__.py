"""Hugging Face checkpoint folders in pure Python, no ranks: safetensors validation, config shapes and geometry,
digests and the sweep."""
