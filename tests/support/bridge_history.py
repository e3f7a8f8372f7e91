"""A synthetic Megatron-Bridge history for the candidate-environment and bisect tests: a git repository holding the
pinned bridge's own files (src/megatron/bridge) and a few commits on top of them."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from dataclasses import dataclass
from pathlib import Path

BRIDGE = Path(sysconfig.get_paths()["purelib"]) / "megatron" / "bridge"
"""The pinned bridge as installed in the test's venv."""
QWEN3 = "src/megatron/bridge/models/qwen/qwen3_bridge.py"
INIT = "src/megatron/bridge/__init__.py"
Q_NORM = '"decoder.layers.*.self_attention.q_layernorm.weight": "model.layers.*.self_attn.q_norm.weight"'
K_NORM = '"decoder.layers.*.self_attention.k_layernorm.weight": "model.layers.*.self_attn.k_norm.weight"'
BROKEN = 'raise ImportError("planted: this commit does not import")\n'


@dataclass(frozen=True)
class History:
    """The repository and its commits, oldest first."""

    repo: Path
    released: str
    planted: str
    broken: str
    unrelated: str
    fixed: str


def git(repo: Path, *args: str) -> str:
    """Run git in `repo` (a fixed identity) and return its stdout."""
    cmd = ["git", "-C", str(repo), "-c", "user.name=convcheck", "-c", "user.email=convcheck@example.com", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def commit(repo: Path, subject: str) -> str:
    """Commit everything in the work tree; the new commit's id."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", subject)
    return git(repo, "rev-parse", "HEAD")


def swap_qk_norm(repo: Path) -> None:
    """The planted conversion change: Qwen3's q_norm and k_norm mapped to each other's Megatron parameter."""
    path = repo / QWEN3
    text = path.read_text()
    assert Q_NORM in text and K_NORM in text, "the pinned bridge's Qwen3 mapping changed: update the planted change"
    swapped_q = Q_NORM.replace("q_norm", "k_norm")
    swapped_k = K_NORM.replace("k_norm", "q_norm")
    path.write_text(text.replace(Q_NORM, "@Q@").replace(K_NORM, swapped_k).replace("@Q@", swapped_q))


def make_history(repo: Path) -> History:
    """released (the pinned bridge) -> planted (Qwen3's q/k norm swapped) -> broken (does not import) -> unrelated
    (a README) -> fixed (imports again). Bisect tests the broken commit first (the middle) and must skip it."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    shutil.copytree(BRIDGE, repo / "src" / "megatron" / "bridge", ignore=shutil.ignore_patterns("__pycache__"))
    released = commit(repo, "release as pinned")
    swap_qk_norm(repo)
    planted = commit(repo, "qwen3: planted conversion change (q_norm and k_norm swapped)")
    init = (repo / INIT).read_text()
    (repo / INIT).write_text(BROKEN + init)
    broken = commit(repo, "refactor: an import that fails")
    (repo / "README.md").write_text("Megatron-Bridge (synthetic history for convcheck's tests)\n")
    unrelated = commit(repo, "docs: add a README")
    (repo / INIT).write_text(init)
    fixed = commit(repo, "fix: the import again")
    return History(repo, released, planted, broken, unrelated, fixed)
