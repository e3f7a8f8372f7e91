"""The Megatron-Bridge release table (releases.toml beside this file): what each release's environment installs."""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from convcheck.errors import BadInput

TABLE = Path(__file__).resolve().parent / "releases.toml"
"""The release table of this checkout."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Release:
    """One Megatron-Bridge release and the stack it was built against."""

    bridge: str
    megatron_core: str
    """The megatron-core release of the bridge's 3rdparty/Megatron-LM pin at its tag."""
    core_pin: str
    transformers: str
    """The transformers of the bridge's uv.lock at its tag."""
    transformers_range: str
    tokenizers: str
    extras: tuple[str, ...] = ()
    """Further pip requirements its environment installs (`name==version`)."""
    unsupported: dict[str, str] = field(default_factory=dict)
    """Fixture name -> why its transformers cannot load that fixture (verify then stops with exit 2)."""
    smoke: dict[str, dict[str, str]] = field(default_factory=dict)
    """`make test-release` case (`FIXTURE@LAYOUT`) -> {failing oracle: its first finding `TENSOR [KIND]`}: the bugs
    this release ships that the smoke names (a case not listed must pass)."""

    def requirements(self) -> list[str]:
        """Every pip requirement its environment installs with --no-deps, one `name==version` each."""
        return [
            f"megatron-core=={self.megatron_core}",
            f"megatron-bridge=={self.bridge}",
            f"transformers=={self.transformers}",
            f"tokenizers=={self.tokenizers}",
            *self.extras,
        ]


def load_releases(path: str | Path = TABLE) -> dict[str, Release]:
    """Bridge version -> Release, in the order of the table; BadInput when a field is missing or misspelt."""
    data = tomllib.loads(Path(path).read_text())
    out = {}
    for bridge, row in data.get("releases", {}).items():
        fields = {k.replace("-", "_"): v for k, v in row.items()}
        fields["extras"] = tuple(fields.get("extras", ()))
        fields["unsupported"] = dict(fields.get("unsupported", {}))
        fields["smoke"] = {case: dict(expected) for case, expected in fields.get("smoke", {}).items()}
        try:
            out[bridge] = Release(bridge=bridge, **fields)
        except TypeError as exc:
            raise BadInput(f"{path}: release {bridge}: {exc}") from None
    return out


def current_release(path: str | Path = TABLE) -> str:
    """The bridge release of the current pins (the table's `current`)."""
    return str(tomllib.loads(Path(path).read_text())["current"])


def get_release(bridge: str, path: str | Path = TABLE) -> Release:
    """The table row of `bridge`; BadInput naming the known releases otherwise."""
    releases = load_releases(path)
    if bridge not in releases:
        raise BadInput(f"unknown bridge release {bridge!r}; known: {', '.join(releases)}")
    return releases[bridge]


def main(argv: list[str] | None = None) -> int:
    """`python -m convcheck.gate.release_table requirements X` prints X's pip lines; `list` prints every release."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args[:1] == ["list"]:
            print("\n".join(load_releases()))
        elif args[:1] == ["requirements"] and len(args) == 2:
            print("\n".join(get_release(args[1]).requirements()))
        else:
            raise BadInput("usage: python -m convcheck.gate.release_table list | requirements BRIDGE_VERSION")
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
