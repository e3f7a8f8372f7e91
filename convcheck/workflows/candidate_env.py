"""Build (or reuse, by stamp) the overlay environment of a candidate plan: a venv without pip whose site-packages
hold the candidate's metadata and a .pth that puts, in order, the candidate bridge's files (copied into the
environment), megatron-core, the convcheck checkout, the pins' layer and the base venv's site-packages on the path."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from convcheck.errors import BadInput, SetupError
from convcheck.workflows.candidate import PACKAGE, Plan, Source, stamp

CANDIDATE_FILE = "convcheck-candidate.json"
"""Written in the environment's root (sys.prefix there): what `convcheck gate check` names as the candidate."""
STAMP_FILE = ".convcheck-env"
REPO = Path(__file__).resolve().parents[2]
"""The convcheck checkout an environment imports convcheck from."""
Note = Callable[[str], None]


def base_site(base: Path) -> tuple[str, str]:
    """(purelib of the base venv, the interpreter it was made from)."""
    code = "import sys, sysconfig; print(sysconfig.get_paths()['purelib']); print(sys._base_executable)"
    out = subprocess.run([str(base / "bin" / "python"), "-c", code], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise BadInput(f"base venv {base} has no working bin/python")
    site, interp = out.stdout.split("\n")[:2]
    return site, interp


def _run(args: list[str], what: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["failed"]
        raise SetupError(f"{what}: {tail[0]}")


def _pip_target(base: Path, target: Path, requirements: list[str], what: str) -> None:
    pip = [str(base / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps"]
    _run([*pip, "--target", str(target), *requirements], what)


def ensure_stack(p: Plan, parent: Path, base: Path, note: Note) -> Path | None:
    """The folder holding the plan's pins (pip --no-deps --target), shared by every candidate with the same pins;
    None when they are the base venv's own."""
    if p.base_stack():
        return None
    key = hashlib.sha256("\n".join([str(base), *p.stack()]).encode()).hexdigest()
    folder = parent / f".venv-stack-{key[:12]}"
    if (folder / STAMP_FILE).is_file():
        return folder
    note(f"make-env: installing {' '.join(p.stack())} into {folder.name}")
    with tempfile.TemporaryDirectory(prefix=".stack-", dir=parent) as tmp:
        _pip_target(base, Path(tmp) / "site", p.stack(), "pip install of the pins")
        (Path(tmp) / "site" / STAMP_FILE).write_text(key + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(Path(tmp) / "site", folder)
    return folder


def _bridge_files(src: Source, dest: Path) -> None:
    """The candidate bridge's package copied to dest/megatron/bridge (a tree) or read out of its commit."""
    target = dest / PACKAGE
    if src.kind == "tree":
        shutil.copytree(src.path, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        return
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / "bridge.tar"
    with archive.open("wb") as out:
        args = ["git", "--git-dir", src.path, "archive", f"--prefix={PACKAGE}/", f"{src.commit}:src/{PACKAGE}"]
        done = subprocess.run(args, stdout=out, stderr=subprocess.PIPE, check=False)
    if done.returncode != 0:
        raise SetupError(f"commit {src.commit[:9]} has no src/{PACKAGE}: {done.stderr.decode().strip()[-200:]}")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()


def _dist_info(site: Path, name: str, version: str, record: dict[str, object]) -> None:
    """Metadata so importlib.metadata reports the candidate's version (ahead of the base venv's release)."""
    local = f"{version}+{record['tag']}" if record.get("tag") and "+" not in version else version
    folder = site / f"{name.replace('-', '_')}-{local}.dist-info"
    folder.mkdir()
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {local}\n")
    (folder / "INSTALLER").write_text("convcheck\n")
    (folder / "direct_url.json").write_text(json.dumps({"url": str(record["spec"]), "convcheck": record}) + "\n")


def build(p: Plan, env: Path, base: Path, note: Note) -> Path:
    """Make `env` for plan `p` (reused when its stamp matches); nothing half-built is left on failure or signal."""
    site_base, interp = base_site(base)
    want = stamp(p, site_base, interp, str(REPO), Path(__file__).read_text())
    if (env / "bin" / "convcheck").is_file() and _read(env / STAMP_FILE) == want:
        note(f"make-env: {env.name} is up to date")
        return env
    stack = ensure_stack(p, env.parent, base, note)
    note(f"make-env: creating {env.name} (bridge {p.bridge.version} {p.bridge.kind}, core {p.core.version}, "
         f"transformers {p.transformers}; pins of release {p.nearest})")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix=f"{env.name}.tmp-", dir=env.parent) as tmp:
        work = Path(tmp) / "env"
        _run([interp, "-m", "venv", "--without-pip", str(work)], "python -m venv")
        site = work / Path(site_base).relative_to(base)
        paths = []
        if p.bridge.kind == "wheel":
            _pip_target(base, site, [p.bridge.path], "pip install of the bridge wheel")
        else:
            _bridge_files(p.bridge, work / "bridge-src")
            _dist_info(site, "megatron-bridge", p.bridge.version, {"tag": p.bridge.tag, **_record(p.bridge)})
            paths.append(env / "bridge-src")
        if p.core.kind == "wheel":
            _pip_target(base, site, [p.core.path], "pip install of the megatron-core wheel")
        elif p.core.kind == "tree":
            paths.append(Path(p.core.path).parents[1])
            _dist_info(site, "megatron-core", p.core.version, {"tag": p.core.tag, **_record(p.core)})
        paths += [REPO, *([stack] if stack else []), Path(site_base)]
        (site / "zz-convcheck-candidate.pth").write_text("".join(f"{q}\n" for q in paths))
        script = work / "bin" / "convcheck"
        script.write_text(f"#!{env}/bin/python\nimport sys\nfrom convcheck.cli import main\nsys.exit(main())\n")
        script.chmod(0o755)
        (work / CANDIDATE_FILE).write_text(json.dumps({**p.to_dict(), "env": str(env)}, indent=1) + "\n")
        (work / STAMP_FILE).write_text(want + "\n")
        shutil.rmtree(env, ignore_errors=True)
        os.replace(work, env)
    return env


def _record(src: Source) -> dict[str, object]:
    return {k: getattr(src, k) for k in ("kind", "spec", "content", "commit", "dirty")}


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def candidate_info(prefix: str | None = None) -> dict[str, object] | None:
    """The candidate this interpreter's environment was made for (its CANDIDATE_FILE), or None (a release)."""
    try:
        return json.loads((Path(prefix or sys.prefix) / CANDIDATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def candidate_line(info: dict[str, object]) -> str:
    """`candidate: megatron-bridge V (commit C, clean|dirty tree) from SPEC; megatron-core ..., transformers ...`."""
    b, c = info["bridge"], info["core"]
    where = [f"commit {b['commit'][:9]}"] if b.get("commit") else []
    if b["kind"] == "tree":
        where.append("no git" if b.get("dirty") is None else "dirty tree" if b["dirty"] else "clean tree")
    if b["kind"] == "wheel":
        where.append(f"wheel sha256 {b['content'][:12]}")
    core = f"megatron-core {c['version']}" + (f" ({c['kind']} {c['spec']})" if c["kind"] != "release" else "")
    return (f"candidate: megatron-bridge {b['version']} ({', '.join(where)}) from {b['spec']}; {core}, "
            f"transformers {info['transformers']} (pins of release {info['nearest']})")  # fmt: skip


def describe(env: Path) -> str:
    """One line: the versions the environment's interpreter reports (metadata only, no megatron import)."""
    code = ("from importlib import metadata as m; print(', '.join(f'{n} {m.version(n)}' for n in ('megatron-core', "
            "'megatron-bridge', 'transformers', 'tokenizers', 'torch')))")  # fmt: skip
    out = subprocess.run([str(env / "bin" / "python"), "-c", code], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SetupError(f"{env.name}: its interpreter cannot read the versions: {out.stderr.strip()[-200:]}")
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    """`python -m convcheck.workflows.candidate_env BRIDGE [CORE] [TRANSFORMERS]` (scripts/make-env.sh): make the
    candidate's environment in the checkout's root; one line and exit 2 on bad input."""
    from convcheck.workflows.candidate import parse_bridge, plan

    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: the half-made environment is removed
    base = Path(os.environ.get("CONVCHECK_BASE_VENV", REPO / ".venv")).resolve()

    def note(line: str) -> None:
        print(line, flush=True)

    try:
        if not args or len(args) > 3:
            raise BadInput("usage: make env BRIDGE=TREE|WHEEL|REPO@REF [CORE=VERSION|TREE|WHEEL] [TRANSFORMERS=V]")
        p = plan(
            parse_bridge(args[0]), core=(args[1:2] or [""])[0] or None, transformers=(args[2:3] or [""])[0] or None
        )
        env = build(p, Path(os.environ.get("CONVCHECK_ENV_DIR") or Path.cwd()).absolute() / p.name, base, note)
        note(f"make-env: {describe(env)}")
    except (BadInput, SetupError) as exc:
        print(f"make-env: error: {exc}", file=sys.stderr)
        return 2
    note(f"make-env: done: {env.relative_to(Path.cwd()) if env.is_relative_to(Path.cwd()) else env}/bin/convcheck")
    return 0


if __name__ == "__main__":
    sys.exit(main())
