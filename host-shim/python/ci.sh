#!/usr/bin/env bash
# Build the dpuio Python package into a virtual environment and run its tests.
#
#   host-shim/python/ci.sh REPO_ROOT VENV
#
# - Creates VENV if needed (kept between runs: it is the cache) and installs maturin,
#   numpy and pytest into it.
# - Tries to install torch (PyPI; on Linux x86-64 that is the CUDA build: about 3 GB
#   of wheels, 5.4 GB installed, ~3 minutes here) within DPUIO_TORCH_INSTALL_TIMEOUT
#   seconds (default 600). If that fails, the torch tests are skipped and both this
#   script and pytest say why; a failed attempt is not repeated for a day
#   (DPUIO_TORCH_RETRY=1 forces it). DPUIO_SKIP_TORCH=1 skips torch on purpose.
# - Builds the extension into VENV with `maturin develop` (dev profile: it shares
#   target/debug with the workspace build) and runs pytest against the agent in
#   REPO_ROOT/target/debug (build it first: cargo build --workspace --bins).
set -euo pipefail

if (($# != 2)); then
    echo "usage: $0 REPO_ROOT VENV" >&2
    exit 2
fi
ROOT=$(cd "$1" && pwd)
VENV=$2
PKG="$ROOT/host-shim/python"
TORCH_TIMEOUT=${DPUIO_TORCH_INSTALL_TIMEOUT:-600}
SKIP_MARK="$VENV/.dpuio-torch-skip-reason"
say() { printf '== python: %s\n' "$*"; }
pip() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@"; }

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import maturin, numpy, pytest' 2>/dev/null; then
    say "installing maturin, numpy, pytest"
    pip install 'maturin>=1.9.4,<2' numpy pytest
fi

# torch, or the reason there is none.
if "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    rm -f "$SKIP_MARK"
elif [ -n "${DPUIO_SKIP_TORCH:-}" ]; then
    echo "DPUIO_SKIP_TORCH is set" >"$SKIP_MARK"
elif [ -f "$SKIP_MARK" ] && [ -z "${DPUIO_TORCH_RETRY:-}" ] &&
    [ -n "$(find "$SKIP_MARK" -mmin -1440 2>/dev/null)" ]; then
    say "not retrying the torch install today ($(cat "$SKIP_MARK")); DPUIO_TORCH_RETRY=1 forces it"
else
    say "installing torch from PyPI (at most ${TORCH_TIMEOUT} s; about 3 GB with its CUDA wheels)"
    t0=$(date +%s)
    log="$VENV/.dpuio-torch-install.log"
    if timeout "$TORCH_TIMEOUT" "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
        --no-cache-dir torch >"$log" 2>&1 && "$VENV/bin/python" -c 'import torch' 2>>"$log"; then
        rm -f "$SKIP_MARK"
        say "torch installed in $(($(date +%s) - t0)) s"
    else
        rc=$?
        if [ "$rc" = 124 ]; then
            reason="pip install torch did not finish within ${TORCH_TIMEOUT} s"
        else
            reason="pip install torch failed: $(tail -n 1 "$log")"
        fi
        echo "$reason" >"$SKIP_MARK"
        say "torch tests will be skipped: $reason (log: $log)"
    fi
fi
if [ -f "$SKIP_MARK" ]; then
    export DPUIO_TORCH_SKIP_REASON
    DPUIO_TORCH_SKIP_REASON="torch is not installed: $(cat "$SKIP_MARK")"
fi

say "building the extension (maturin develop)"
t0=$(date +%s)
build_log="$VENV/.dpuio-build.log"
if ! (cd "$PKG" && VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" maturin develop >"$build_log" 2>&1); then
    cat "$build_log" >&2
    echo "python: maturin develop failed (log above)" >&2
    exit 1
fi
say "built in $(($(date +%s) - t0)) s"

say "pytest"
cd "$PKG"
DPUIO_BIN_DIR="${DPUIO_BIN_DIR:-$ROOT/target/debug}" "$VENV/bin/python" -m pytest -q -rs tests
say "done in $(($(date +%s) - start)) s"
