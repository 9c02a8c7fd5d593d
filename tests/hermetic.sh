# Sourced by ./x, .ci/run and host-shim/python/ci.sh: run the tests as on a fresh machine.
#
# dpuio_hermetic_env gives this shell a scratch HOME (and DPUIO_CONFIG_DIR inside it) and
# drops the user's DPUIO_* client settings, so a client bundle or setting an earlier run left
# in the real home directory can neither hide a failure nor be overwritten. What is only a
# toolchain or a download cache keeps pointing at the real home: RUSTUP_HOME, CARGO_HOME,
# PYENV_ROOT (where python3 comes from on this machine kind) and pip's cache. Calling it again
# in a child keeps the first scratch HOME. The caller removes $DPUIO_SCRATCH_HOME when done.
dpuio_hermetic_env() {
    if [ -n "${DPUIO_SCRATCH_HOME:-}" ] && [ "${HOME:-}" = "$DPUIO_SCRATCH_HOME" ]; then
        return 0
    fi
    local real_home=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
    if [ -z "${RUSTUP_HOME:-}" ] && [ -d "$real_home/.rustup" ]; then
        export RUSTUP_HOME="$real_home/.rustup"
    fi
    if [ -z "${CARGO_HOME:-}" ] && [ -d "$real_home/.cargo" ]; then
        export CARGO_HOME="$real_home/.cargo"
    fi
    if [ -z "${PYENV_ROOT:-}" ] && [ -d "$real_home/.pyenv" ]; then
        export PYENV_ROOT="$real_home/.pyenv"
    fi
    export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$real_home/.cache/pip}
    DPUIO_SCRATCH_HOME=$(mktemp -d "${TMPDIR:-/tmp}/dpuio-home.XXXXXX")
    export DPUIO_SCRATCH_HOME HOME=$DPUIO_SCRATCH_HOME
    export DPUIO_CONFIG_DIR=$DPUIO_SCRATCH_HOME/.config/dpuio
    unset DPUIO_AGENT DPUIO_CERT DPUIO_KEY DPUIO_CA DPUIO_TOKEN DPUIO_TENANT DPUIO_TRANSPORT DPUIO_INTERFACE
}
