#!/usr/bin/env bash
# Create .venv-bridge-X/ for Megatron-Bridge release X (or a candidate: a tree, a wheel, REPO@REF; see below) (convcheck/gate/releases.toml): its own site-packages hold the
# release's megatron-core, megatron-bridge, transformers, tokenizers and extras (all --no-deps) and convcheck
# (editable); a .pth file appends the base venv's site-packages AFTER its own, so torch and the other heavy packages
# are reused and the release's own pins win. The base venv is $CONVCHECK_BASE_VENV, else .venv (made by
# scripts/setup-venv.sh); it is never modified. Idempotent: a stamp of the inputs makes a second run return at once.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "make-env: error: $*" >&2; exit 2; }

BRIDGE=${1:-${BRIDGE:-}}
[ -n "$BRIDGE" ] || die "say which release: make env BRIDGE=X (X one of: $(tr '\n' ' ' < <(python3 -m convcheck.gate.release_table list 2>/dev/null)))"
BASE=${CONVCHECK_BASE_VENV:-.venv}
if [ ! -x "$BASE/bin/python" ]; then
  [ "$BASE" = .venv ] || die "base venv $BASE has no bin/python (set CONVCHECK_BASE_VENV to a venv made by scripts/setup-venv.sh)"
  scripts/setup-venv.sh
fi
BASE=$(cd "$BASE" && pwd)
BASE_PY="$BASE/bin/python"
# Not a release: a source tree, a wheel or REPO@REF of a clone (convcheck/workflows/candidate_env.py; CORE= and
# TRANSFORMERS= choose megatron-core and transformers, default: the pins of the nearest release; the env goes into
# $CONVCHECK_ENV_DIR, default the repo root).
if [[ "$BRIDGE" == *.whl || -d "$BRIDGE" || "$BRIDGE" == *@* ]]; then
  exec "$BASE_PY" -I -c 'import sys; sys.path.insert(0, "."); from convcheck.workflows.candidate_env import main; sys.exit(main())' "$BRIDGE" "${CORE:-}" "${TRANSFORMERS:-}"
fi
# the repo's convcheck/gate/release_table.py, not an installed copy (-I: no user site, no PYTHONPATH; -c: cwd first on sys.path)
REQS=$(cd "$PWD" && "$BASE_PY" -I -c 'import sys; sys.path.insert(0, "."); from convcheck.gate.release_table import main; sys.exit(main())' requirements "$BRIDGE") || exit 2
BASE_SITE=$("$BASE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
INTERP=$("$BASE_PY" -c 'import sys; print(sys._base_executable)')  # the interpreter the base venv was made from

ENV=".venv-bridge-$BRIDGE"
STAMP="$ENV/.convcheck-env"
want=$(printf '%s\n' "$REQS" "$BASE_SITE" "$INTERP" | cat - pyproject.toml scripts/make-env.sh | sha256sum | cut -c1-16)
if [ -x "$ENV/bin/convcheck" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "make-env: $ENV is up to date"
  exit 0
fi

echo "make-env: creating $ENV with $INTERP (base site-packages: $BASE_SITE)"
rm -rf "$ENV"
"$INTERP" -m venv "$ENV"
PIP=("$ENV/bin/python" -m pip --disable-pip-version-check -q)
# Installed before the .pth exists, so pip sees only this venv and never touches the base venv.
# shellcheck disable=SC2086
"${PIP[@]}" install --no-deps $REQS
"${PIP[@]}" install --no-deps -e .
SITE=$("$ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$BASE_SITE" > "$SITE/zz-convcheck-base-venv.pth"  # processed last; a plain path: appended after own packages
"$ENV/bin/python" - <<'EOF'
from importlib import metadata
print("make-env:", ", ".join(f"{n} {metadata.version(n)}" for n in ("megatron-core", "megatron-bridge", "transformers", "tokenizers", "torch")))
EOF
"$ENV/bin/convcheck" --version
echo "$want" > "$STAMP"
echo "make-env: done: $ENV/bin/convcheck"
