"""An unreleased Megatron-Bridge candidate (a source tree, a wheel, or a commit of a clone) and what its environment
holds: the candidate, its megatron-core, the nearest release's other pins, a name and a content stamp (no torch)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from convcheck.errors import BadInput
from convcheck.gate.release_table import Release, current_release, load_releases

PACKAGE = Path("megatron") / "bridge"
"""The bridge package inside a source tree (under `src/` in the repository)."""
CORE_PACKAGE = Path("megatron") / "core"
_FIELD = re.compile(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*[\"']?([^\"'\s#]*)", re.M)


@dataclass(frozen=True, kw_only=True, slots=True)
class Source:
    """One package of a candidate environment: where it comes from and what identifies its content."""

    kind: str
    """"release" (a pip version), "tree" (a source folder), "wheel" (a .whl file) or "commit" (of a git clone)."""
    spec: str
    """As the user gave it."""
    version: str
    content: str
    """Content key: the commit id, the wheel's sha256, or a sha256 over the package's files."""
    path: str = ""
    """The tree's package folder, the wheel file, or the clone's git folder."""
    commit: str | None = None
    dirty: bool | None = None
    """A tree in a git work tree: uncommitted changes under the package."""
    subject: str | None = None

    @property
    def tag(self) -> str:
        """The name part that tells this content from another of the same version."""
        if self.kind == "commit":
            return f"g{self.commit[:9]}"
        if self.kind == "tree":
            if self.commit and not self.dirty:
                return f"g{self.commit[:9]}"
            return f"g{self.commit[:9]}.dirty.{self.content[:8]}" if self.commit else f"tree.{self.content[:8]}"
        return f"whl.{self.content[:8]}" if self.kind == "wheel" else ""


def git(repo: str | Path, *args: str) -> str:
    """`git -C repo ARGS` -> stripped stdout; BadInput naming the command on failure."""
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise BadInput(f"cannot run git: {exc}") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise BadInput(f"git -C {repo} {' '.join(args)}: {why}")
    return done.stdout.strip()


def git_dir(repo: str | Path) -> str:
    """The git folder of a clone (bare or with a work tree); BadInput when `repo` is not one."""
    if not Path(repo).is_dir():
        raise BadInput(f"not a folder: {repo}")
    try:
        return str(Path(repo, git(repo, "rev-parse", "--git-dir")).resolve())
    except BadInput:
        raise BadInput(f"not a git repository: {repo}") from None


def version_of(package_info: str) -> str:
    """The version a bridge's package_info.py declares (MAJOR.MINOR.PATCH + PRE_RELEASE), or "0+unknown"."""
    fields = dict(_FIELD.findall(package_info))
    if not all(k in fields for k in ("MAJOR", "MINOR", "PATCH")):
        return "0+unknown"
    return f"{fields['MAJOR']}.{fields['MINOR']}.{fields['PATCH']}{fields.get('PRE_RELEASE', '')}"


def files_digest(folder: Path) -> str:
    """sha256 over every file's relative path and bytes (caches and bytecode left out)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        if path.suffix in (".pyc", ".pyo"):
            continue
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _tree_package(root: Path, package: Path) -> Path | None:
    for candidate in (root / "src" / package, root / package):
        if (candidate / "__init__.py").is_file():
            return candidate
    return None


def bridge_tree(spec: str) -> Source:
    """A Megatron-Bridge source tree: the folder holding src/megatron/bridge (or megatron/bridge)."""
    root = Path(spec).resolve()
    package = _tree_package(root, PACKAGE)
    if package is None:
        raise BadInput(f"{spec} is not a Megatron-Bridge source tree (no src/megatron/bridge/__init__.py)")
    info = package / "package_info.py"
    version = version_of(info.read_text()) if info.is_file() else "0+unknown"
    commit = dirty = None
    try:
        commit = git(package, "rev-parse", "HEAD")
        dirty = bool(git(package, "status", "--porcelain", "--", "."))
    except BadInput:  # not in a git work tree
        pass
    return Source(kind="tree", spec=spec, version=version, content=files_digest(package), path=str(package),
                  commit=commit, dirty=dirty)  # fmt: skip


def bridge_commit(repo: str | Path, ref: str) -> Source:
    """Commit `ref` of a Megatron-Bridge clone (bare or not); BadInput when it is no commit or has no bridge."""
    gdir = git_dir(repo)
    try:
        commit = git(gdir, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except BadInput:
        raise BadInput(f"unknown revision {ref!r} in {repo}") from None
    try:
        info = git(gdir, "show", f"{commit}:src/{PACKAGE}/package_info.py")
    except BadInput:
        info = ""
    subject = git(gdir, "log", "-1", "--format=%s", commit)
    return Source(kind="commit", spec=f"{repo}@{ref}", version=version_of(info), content=commit, path=gdir,
                  commit=commit, subject=subject)  # fmt: skip


def wheel(spec: str, name: str) -> Source:
    """A wheel file of distribution `name` (megatron_bridge or megatron_core)."""
    path = Path(spec).resolve()
    parts = path.name.split("-")
    if not path.is_file() or len(parts) < 3 or parts[0].lower().replace("-", "_") != name:
        raise BadInput(f"{spec} is not a {name} wheel file")
    return Source(kind="wheel", spec=spec, version=parts[1], content=hashlib.sha256(path.read_bytes()).hexdigest(),
                  path=str(path))  # fmt: skip


def parse_bridge(spec: str) -> Source:
    """BRIDGE=: a source tree, a .whl file, or REPO@REF (a commit, branch or tag of a local clone)."""
    if spec.endswith(".whl"):
        return wheel(spec, "megatron_bridge")
    if Path(spec).is_dir():
        return bridge_tree(spec)
    repo, at, ref = spec.rpartition("@")
    if at and repo and ref:
        return bridge_commit(repo, ref)
    raise BadInput(f"BRIDGE={spec}: not a release ({', '.join(load_releases())}), a source tree, a .whl file, "
                   "or REPO@REF of a git clone")  # fmt: skip


def parse_core(spec: str) -> Source:
    """CORE=: a megatron-core version (from the package index), a source tree, or a .whl file."""
    if spec.endswith(".whl"):
        return wheel(spec, "megatron_core")
    if Path(spec).is_dir():
        package = _tree_package(Path(spec).resolve(), CORE_PACKAGE)
        if package is None:
            raise BadInput(f"{spec} is not a megatron-core source tree (no megatron/core/__init__.py)")
        return Source(kind="tree", spec=spec, version=_core_tree_version(package), content=files_digest(package),
                      path=str(package))  # fmt: skip
    if not re.fullmatch(r"\d+(\.\d+)*([a-z]+\d*)?(\.dev\d+)?", spec):
        raise BadInput(f"CORE={spec}: not a megatron-core version, source tree or .whl file")
    return Source(kind="release", spec=spec, version=spec, content=spec)


def _core_tree_version(package: Path) -> str:
    info = package / "package_info.py"
    return version_of(info.read_text()) if info.is_file() else "0+unknown"


def nearest_release(version: str) -> Release:
    """The newest release at or before `version` (a dev or rc of X.Y.Z counts as before X.Y.Z); else the oldest."""
    from packaging.version import InvalidVersion, Version

    releases = load_releases()
    try:
        wanted = Version(version)
    except InvalidVersion:
        return releases[current_release()]
    older = [r for r in releases if Version(r) <= wanted]
    return releases[max(older, key=Version) if older else min(releases, key=Version)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """What one candidate environment holds: the bridge, megatron-core, and the pins of the nearest release."""

    bridge: Source
    core: Source
    transformers: str
    tokenizers: str
    extras: tuple[str, ...]
    nearest: str

    def stack(self) -> list[str]:
        """pip requirements of the layer under the bridge (megatron-core from the index, transformers, extras)."""
        core = [f"megatron-core=={self.core.version}"] if self.core.kind == "release" else []
        return [*core, f"transformers=={self.transformers}", f"tokenizers=={self.tokenizers}", *self.extras]

    def base_stack(self) -> bool:
        """True when the base venv (the current pins) already holds every package of that layer: nothing to install."""
        return set(self.stack()) <= set(load_releases()[current_release()].requirements())

    @property
    def name(self) -> str:
        """`.venv-bridge-VERSION+TAG[-coreX][-tfY]`: what the environment holds."""
        label = f".venv-bridge-{self.bridge.version.replace('+', '.')}+{self.bridge.tag}"
        default = nearest_release(self.bridge.version)
        if self.core.kind != "release" or self.core.version != default.megatron_core:
            label += f"-core{self.core.version}{('.' + self.core.tag) if self.core.tag else ''}"
        if self.transformers != default.transformers:
            label += f"-tf{self.transformers}"
        return label

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: every source and pin."""
        return {**asdict(self), "extras": list(self.extras)}


def plan(bridge: Source, core: str | None = None, transformers: str | None = None, pins: str | None = None) -> Plan:
    """The environment of `bridge`: megatron-core `core` (default: the nearest release's), transformers likewise;
    `pins` names the release whose pins to take instead of the bridge's nearest (bisect holds them fixed)."""
    release = load_releases()[pins] if pins else nearest_release(bridge.version)
    tokenizers = release.tokenizers
    if transformers and transformers != release.transformers:
        same = [r for r in load_releases().values() if r.transformers == transformers]
        tokenizers = same[0].tokenizers if same else tokenizers
    return Plan(bridge=bridge, core=parse_core(core or release.megatron_core), transformers=transformers or
                release.transformers, tokenizers=tokenizers, extras=release.extras, nearest=release.bridge)  # fmt: skip


def stamp(p: Plan, *inputs: str) -> str:
    """The content stamp of a plan and the builder's other inputs (base venv, interpreter, convcheck checkout)."""
    return hashlib.sha256(json.dumps([p.to_dict(), *inputs], sort_keys=True).encode()).hexdigest()[:16]
