#!/usr/bin/env bash
# Build the dpuio Python package into a virtual environment and run its tests.
#
#   host-shim/python/ci.sh [--prepare] REPO_ROOT VENV
#
# With --prepare it only installs (the first two steps below) and stops: ./x test runs that
# in the background while it compiles, since the downloads need the network, not the cores.
#
# - Creates VENV if needed (kept between runs: it is the cache) and installs maturin,
#   numpy and pytest into it.
# - Tries to install torch within DPUIO_TORCH_INSTALL_TIMEOUT seconds in all (default
#   600): first the CPU-only wheel from download.pytorch.org (about 200 MB), then, if
#   that fails, PyPI's (on Linux x86-64 the CUDA build: about 3 GB of wheels). If both
#   fail, the torch tests are skipped and both this script and pytest say why; a failed
#   attempt is not repeated for a day (DPUIO_TORCH_RETRY=1 forces it).
#   DPUIO_SKIP_TORCH=1 does not try to install it (the tests say so when they skip).
# - Builds the extension into VENV with `maturin develop` (dev profile: it shares
#   target/debug, or $CARGO_TARGET_DIR/debug, with the workspace build) and runs pytest
#   against the agent in $DPUIO_BIN_DIR, default that same directory (build it first:
#   cargo build --workspace --bins).
# - Stops pytest after DPUIO_PYTEST_DEADLINE seconds (default 1800; a run takes 1-3
#   minutes) with SIGINT, so a stuck test ends the run with pytest's report of where it
#   was (and every thread's stack, printed after 300 s of one test) instead of hanging it.
# - Runs with a scratch HOME and none of the user's DPUIO_* settings (tests/hermetic.sh),
#   unless its caller (./x test) already made one.
set -euo pipefail

PREPARE_ONLY=""
if [ "${1:-}" = --prepare ]; then
    PREPARE_ONLY=1
    shift
fi
if (($# != 2)); then
    echo "usage: $0 [--prepare] REPO_ROOT VENV" >&2
    exit 2
fi
ROOT=$(cd "$1" && pwd)
VENV=$2
# shellcheck source=../../tests/hermetic.sh
source "$ROOT/tests/hermetic.sh"
scratch_before=${DPUIO_SCRATCH_HOME:-}
dpuio_hermetic_env
if [ "$DPUIO_SCRATCH_HOME" != "$scratch_before" ]; then
    trap 'rm -rf "$DPUIO_SCRATCH_HOME"' EXIT
fi
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
    t0=$(date +%s)
    pip install 'maturin>=1.9.4,<2' numpy pytest
    say "installed in $(($(date +%s) - t0)) s"
fi

# torch, or the reason there is none (for pytest's skip messages).
skip_reason=""
# The CPU-only wheel first; then pip's configured index (PyPI unless pip.conf says).
TORCH_INDEXES=("https://download.pytorch.org/whl/cpu" "PyPI")
try_torch() {  # try_torch INDEX SECONDS LOG: install torch from INDEX within SECONDS
    local from=()
    [ "$1" = PyPI ] || from=(--index-url "$1")
    timeout "$2" "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir \
        "${from[@]}" torch >>"$3" 2>&1 && "$VENV/bin/python" -c 'import torch' >>"$3" 2>&1
}
if "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    rm -f "$SKIP_MARK"
elif [ -n "${DPUIO_SKIP_TORCH:-}" ]; then
    skip_reason="DPUIO_SKIP_TORCH is set"
elif [ -f "$SKIP_MARK" ] && [ -z "${DPUIO_TORCH_RETRY:-}" ] &&
    [ -n "$(find "$SKIP_MARK" -mmin -1440 2>/dev/null)" ]; then
    say "not retrying the torch install today ($(cat "$SKIP_MARK")); DPUIO_TORCH_RETRY=1 forces it"
else
    t0=$(date +%s)
    deadline=$((t0 + TORCH_TIMEOUT))
    log="$VENV/.dpuio-torch-install.log"
    : >"$log"
    reasons=()
    for index in "${TORCH_INDEXES[@]}"; do
        left=$((deadline - $(date +%s)))
        if ((left <= 0)); then
            reasons+=("no time left for $index")
            continue
        fi
        say "installing torch from $index (at most $left s)"
        if try_torch "$index" "$left" "$log"; then
            reasons=()
            break
        else
            rc=$?
            if [ "$rc" = 124 ]; then
                reasons+=("$index: did not finish within $left s")
            else
                reasons+=("$index: $(grep -v '^\s*$' "$log" | tail -n 1)")
            fi
            say "that failed (${reasons[-1]})"
        fi
    done
    if "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
        rm -f "$SKIP_MARK"
        say "torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') installed in $(($(date +%s) - t0)) s"
    else
        reason="pip install torch failed: $(IFS=';'; echo "${reasons[*]}")"
        echo "$reason" >"$SKIP_MARK"
        say "torch tests will be skipped: $reason (log: $log)"
    fi
fi
if [ -z "$skip_reason" ] && [ -f "$SKIP_MARK" ]; then
    skip_reason=$(cat "$SKIP_MARK")
fi
if [ -n "$skip_reason" ]; then
    export DPUIO_TORCH_SKIP_REASON="torch is not installed: $skip_reason"
fi

if [ -n "$PREPARE_ONLY" ]; then
    say "prepared in $(($(date +%s) - start)) s (maturin, numpy, pytest${skip_reason:+; no torch: $skip_reason})"
    exit 0
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
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
DPUIO_BIN_DIR="${DPUIO_BIN_DIR:-$TARGET_DIR/debug}" timeout -s INT -k 60 "${DPUIO_PYTEST_DEADLINE:-1800}" \
    "$VENV/bin/python" -m pytest -q -rs tests
say "done in $(($(date +%s) - start)) s"
