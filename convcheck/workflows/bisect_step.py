"""One bisect step inside a candidate environment: run one gate case and write its manifest, or say why it could not
run (`python -m convcheck.workflows.bisect_step CASE_ID OUT [--timeout S] [--hook SPEC ...]`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with OUT the manifest, or exit 3 with OUT.error holding one line (the case did not run)."""
    import argparse
    import signal

    from convcheck.engine.launch import Interrupted

    def _terminate(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, _terminate)  # the launch stops its ranks and removes its folders, then we exit
    from convcheck.errors import ConvcheckError
    from convcheck.gate.case import default_matrix, select
    from convcheck.workflows.gate_runner import Options, run_case

    parser = argparse.ArgumentParser(prog="convcheck.workflows.bisect_step")
    parser.add_argument("case")
    parser.add_argument("out", type=Path)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--hook", action="append", default=[])
    args = parser.parse_args(argv)
    try:
        case = select(default_matrix(), ids=(args.case,))[0]
        manifest, error = run_case(case, args.out, Options(hooks=tuple(args.hook), timeout_s=args.timeout))
    except Interrupted as exc:
        return exc.exit_code
    except ConvcheckError as exc:
        manifest, error = None, str(exc)
    except Exception as exc:  # noqa: BLE001 - an older bridge that cannot even be imported is a skipped commit
        manifest, error = None, f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
    if manifest is None:
        Path(f"{args.out}.error").write_text(json.dumps({"error": error}) + "\n")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
