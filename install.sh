#!/usr/bin/env bash
# Install mlrb into ./.venv (created if missing). Usage: bash install.sh [--dev]
#   --dev   also install the test tools (pytest, pytest-xdist) and the Inspect log export (inspect-ai)
# torch is pinned here: MLRB_TORCH overrides the requirement (e.g. a CUDA build on a GPU box).
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
# uv installs the packages: it resolves, fetches and unpacks them on every core. `install.sh --dev`
# in a fresh clone took 57 CPU s and 38 s here, against pip's 81 and 83, and 47 and 32 from uv's
# cache (a second clone); about 33 CPU s of each is the compile below (on both cores). pip installs
# uv, and upgrades itself in the venv.
UV_SPEC=uv==0.13.9
.venv/bin/python -m pip install --quiet --no-compile --upgrade pip "$UV_SPEC"
# uv reads none of pip's configuration, so it is handed where pip would take packages from (a mirror,
# an extra index such as PyTorch's for MLRB_TORCH, a wheel folder, a certificate), as
# `pip config list` prints them: for each, the value pip uses, a variable's over its install
# section's over its global one's (pip lists them sorted by name or in that order, by its version).
# Like pip, uv takes the best match of all the indexes (every version is pinned anyway). Sets
# uv_options and exports SSL_CERT_FILE.
uv_options_from_pip() {
    local setting key value rank index_url="" extra_index_urls="" find_links="" cert=""
    local index_rank=0 extra_rank=0 links_rank=0 cert_rank=0
    while IFS= read -r setting; do
        key=${setting%%=*} value=${setting#*=}
        case ${key%%.*} in global) rank=1 ;; install) rank=2 ;; :env:) rank=3 ;; *) continue ;; esac
        value=${value#\'} value=${value%\'} value=${value//\\n/ }  # quoted, its lines as \n
        case ${key#*.} in
            index-url) ((rank < index_rank)) || { index_url=$value index_rank=$rank; } ;;
            extra-index-url) ((rank < extra_rank)) || { extra_index_urls=$value extra_rank=$rank; } ;;
            find-links) ((rank < links_rank)) || { find_links=$value links_rank=$rank; } ;;
            cert) ((rank < cert_rank)) || { cert=$value cert_rank=$rank; } ;;
        esac
    done < <("$1" -m pip config list 2>/dev/null)
    [[ -z "$cert" ]] || export SSL_CERT_FILE=$cert
    uv_options=(--index-strategy unsafe-best-match)
    [[ -z "$index_url" ]] || uv_options+=(--index-url "$index_url")
    for value in $extra_index_urls; do uv_options+=(--extra-index-url "$value"); done
    for value in $find_links; do uv_options+=(--find-links "$value"); done
}
uv_options_from_pip .venv/bin/python
uv_install=(.venv/bin/uv pip install --quiet "${uv_options[@]}")
# torch as asked, and the rest at the exact versions every machine gets (requirements.lock, see its
# header). Nothing is compiled here: mlrb.core.bytecode compiles what the runs import (compiling
# every module took about 110 CPU s more, most of them never imported), which their sandboxes mount
# read-only.
"${uv_install[@]}" --python .venv/bin/python "$TORCH_SPEC" -c requirements.lock -e ".${EXTRAS}"
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
    "${uv_install[@]}" --python .venv-harbor/bin/python "$HARBOR_SPEC"  # compiled where first run
    echo "harbor installed in $(pwd)/.venv-harbor ($HARBOR_SPEC)"
fi
