#!/usr/bin/env bash
# Create or refresh .venv/ with Python 3.12, the pinned stack and convcheck (editable). Idempotent: when
# nothing changed since the last successful run it only checks a stamp and exits in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
STAMP="$VENV/.convcheck-setup"

find_python312() {
  local cand
  for cand in "${CONVCHECK_PYTHON:-}" python3.12 "$(command -v pyenv >/dev/null 2>&1 && pyenv root 2>/dev/null)/versions/"3.12*/bin/python3.12 \
      "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 \
      /usr/local/bin/python3.12 /usr/bin/python3.12; do
    [ -n "$cand" ] || continue
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      command -v "$cand"
      return 0
    fi
  done
  return 1
}

if [ "${1:-}" = "--find-python" ]; then
  find_python312
  exit
fi

want=$(cat requirements/pins.txt requirements/no-deps.txt pyproject.toml scripts/setup-venv.sh | sha256sum | cut -c1-16)
if [ -x "$VENV/bin/convcheck" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "setup: .venv is up to date"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
  PY=$(find_python312) || {
    echo "setup: error: no Python 3.12 interpreter found (tried \$CONVCHECK_PYTHON, python3.12, pyenv versions 3.12.*)." >&2
    echo "setup: megatron-core 0.19.2 needs Python 3.12; install it (e.g. 'pyenv install 3.12') or set CONVCHECK_PYTHON." >&2
    exit 2
  }
  echo "setup: creating $VENV with $PY"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
fi

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q -r requirements/pins.txt
"${PIP[@]}" install -q --no-deps -r requirements/no-deps.txt
"${PIP[@]}" install -q --no-deps -e .
"$VENV/bin/convcheck" --version
echo "$want" > "$STAMP"
echo "setup: done"
