#!/usr/bin/env bash
# Install mlrb into ./.venv (created if missing). Usage: bash install.sh [--dev]
#   --dev   also install the test tools (pytest, pytest-xdist) and the Inspect log export (inspect-ai)
# torch is installed first and pinned, so that resolving the other packages never
# replaces it: MLRB_TORCH overrides the requirement (e.g. a CUDA build on a GPU box).
# Everything else is pinned by requirements.lock.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${MLRB_TORCH:-torch==2.13.0}
EXTRAS=""
[[ "${1:-}" == "--dev" ]] && EXTRAS="[dev,inspect]"

if [[ ! -x .venv/bin/python ]]; then
    "$PYTHON" -m venv .venv
fi
# --no-compile: pip would compile every module it installs (about 110 CPU s here, most of them never
# imported); mlrb.core.bytecode compiles what the runs import, which their sandboxes mount read-only.
.venv/bin/python -m pip install --quiet --no-compile --upgrade pip
.venv/bin/python -m pip install --quiet --no-compile "$TORCH_SPEC"
# requirements.lock: the exact versions every machine gets (see its header).
.venv/bin/python -m pip install --quiet --no-compile -c requirements.lock -e ".${EXTRAS}"
MLFLOW_DISABLE_TELEMETRY=true .venv/bin/python -m mlrb.core.bytecode >/dev/null
echo "mlrb installed in $(pwd)/.venv"

# --dev: Harbor's own CLI (it needs Python >= 3.12) in a venv of its own, .venv-harbor, for the
# tests that run exported tasks with it. The newest harbor that installs here, pinned.
HARBOR_SPEC=harbor==0.26.0
if [[ -n "$EXTRAS" && ! -x .venv-harbor/bin/harbor ]]; then
    PY312=""
    # pyenv's own folder, from where its program is: `pyenv root` and its shims look in $HOME,
    # which a new user's HOME does not hold
    PYENV_HOME=""
    if command -v pyenv >/dev/null; then PYENV_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v pyenv)")")"); fi
    for candidate in "${MLRB_PYTHON312:-}" "${PYENV_ROOT:-/nonexistent}"/versions/3.1[2-9]*/bin/python3 \
            "${PYENV_HOME:-/nonexistent}"/versions/3.1[2-9]*/bin/python3 python3.12 python3.13 python3; do
        if [[ -n "$candidate" ]] && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            PY312=$candidate
            break
        fi
    done
    if [[ -z "$PY312" ]]; then
        echo "install.sh --dev: Harbor needs Python 3.12 or newer and none was found: install it (pyenv install 3.12) or set MLRB_PYTHON312" >&2
        exit 1
    fi
    "$PY312" -m venv .venv-harbor
    .venv-harbor/bin/python -m pip install --quiet --no-compile "$HARBOR_SPEC"  # compiled where first run
    echo "harbor installed in $(pwd)/.venv-harbor ($HARBOR_SPEC)"
fi
