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
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "$TORCH_SPEC"
# requirements.lock: the exact versions every machine gets (see its header).
.venv/bin/python -m pip install --quiet -c requirements.lock -e ".${EXTRAS}"
echo "mlrb installed in $(pwd)/.venv"
