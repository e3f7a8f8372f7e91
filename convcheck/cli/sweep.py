"""`convcheck sweep A B` and `convcheck digest SRC`: thin click commands over convcheck.hf.sweep (run in a child
process, convcheck.hf.sweep_command) and convcheck.hf.digest."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import click

from convcheck.errors import ConvcheckError
from convcheck.hf.checkpoint import open_weights
from convcheck.hf.console import bad_input, progress_bar, size_text
from convcheck.hf.digest import HASH, check_output, digest_weights, write_digest


@click.command()
@click.argument("a")
@click.argument("b")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the report as JSON.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), help="Write JUnit XML.")
@click.option("--quiet", is_flag=True, help="Print only the summary line.")
def sweep(a: str, b: str, json_path: str | None, junit_path: str | None, quiet: bool) -> None:
    """Compare checkpoint B with reference A tensor by tensor, by raw bytes (or digests if one is a manifest).

    A and B: a folder with model.safetensors.index.json or model.safetensors, a .safetensors file, or a manifest
    written by `convcheck digest`. Exit 0 identical, 1 differences found, 2 bad input.
    """
    options = [*(["--json", json_path] if json_path else []), *(["--junit", junit_path] if junit_path else [])]
    options += ["--quiet"] if quiet else []
    command = [sys.executable, "-m", "convcheck.hf.sweep_command", *options, "--", a, b]
    sys.stdout.flush()
    sys.exit(subprocess.run(command, stdin=subprocess.DEVNULL, check=False).returncode)


@click.command()
@click.argument("src")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the manifest here (default: standard output).")
def digest(src: str, out: str | None) -> None:
    """Write a digest manifest of SRC: the hash of every tensor's raw stored bytes, with its dtype and shape.

    SRC: a checkpoint folder or a .safetensors file. Compare it later with `convcheck sweep CHECKPOINT MANIFEST`.
    """
    started = time.perf_counter()
    try:
        if out:
            check_output(out)
        if Path(src).suffix == ".json" and Path(src).is_file():
            raise ConvcheckError(f"{src} is a JSON file, not safetensors weights")
        weights = open_weights(src)
        total = sum(e.nbytes for e in weights.tensors.values())
        with progress_bar(total, "digest", quiet=False) as progress:
            if not out:
                click.echo(digest_weights(weights, HASH, progress).to_json(), nl=False)
                return
            manifest = write_digest(weights, out, progress)
    except ConvcheckError as exc:
        bad_input(exc)
    click.echo(
        f"wrote {out}: {len(manifest.tensors)} tensors, {total} bytes ({size_text(total)}) hashed with {manifest.hash},"
        f" {time.perf_counter() - started:.2f} s"
    )
