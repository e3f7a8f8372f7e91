"""What the warm server imports once, after it set the environment torch reads when it loads (OMP_NUM_THREADS,
CUDA_VISIBLE_DEVICES): the CPU shims, the rank's work, every oracle module and each family's transformers modeling
module; nothing here runs torch."""

from __future__ import annotations

import transformers

from convcheck import compat
from convcheck.engine import rank_run  # noqa: F401 - what every forked rank runs
from convcheck.models import BY_HF_CLASS
from convcheck.oracles import ORACLES, load_oracle


def preload() -> None:
    """Install the CPU shims (as a CPU rank does first) and import every oracle and family modeling module."""
    compat.install("cpu")
    for name in ORACLES:
        load_oracle(name)
    for hf_class in BY_HF_CLASS:  # transformers imports a family's modeling module on first use (~6 s for NemotronH)
        getattr(transformers, hf_class, None)
