# shellcheck shell=bash
# Sourced by the bench scripts (daos-identity.sh, daos-peers.sh, dlio.sh): start the agent.
#   agent_up BIN WORK   runs BIN/dpu-agent on WORK/agent.toml (data in WORK/data, its
#                       output in WORK/agent.out and WORK/agent.err), waits until it
#                       listens, and sets agent_pid and addr. Needs a `die` function.
agent_up() {
    local bin=$1 work=$2
    (unset LD_LIBRARY_PATH; RUST_LOG=warn DPUIO_CONFIG_DIR="$work/client" exec "$bin/dpu-agent" serve \
        --config "$work/agent.toml" --data-dir "$work/data" --listen 127.0.0.1:0 >"$work/agent.out" 2>"$work/agent.err") &
    agent_pid=$!
    for _ in $(seq 300); do
        grep -q "listening on" "$work/agent.out" 2>/dev/null && break
        kill -0 "$agent_pid" 2>/dev/null || { cat "$work/agent.err" >&2; die "the agent stopped"; }
        sleep 0.2
    done
    addr=$(sed -n 's/^dpu-agent listening on \([^ ]*\) .*/\1/p' "$work/agent.out")
    [ -n "$addr" ] || die "the agent did not say where it listens"
}

# For the scripts on a DAOS system (daos-peers.sh, dlio.sh); they need `die` and `daos_dir`
# (the directory of ../shared/daos/daos-up.sh).
#   daos_up RUNDIR WORK      with a RUNDIR, start a DAOS system of its own there with
#                            $daos_dir/daos-up.sh (a 4 GB pool on 6 GiB of RAM unless
#                            DAOS_POOL_SIZE/DAOS_SCM_GIB say otherwise; its output in
#                            WORK/daos-up.log) and source its env file; without, use the
#                            running one whose env file is sourced. Either way DAOS_POOL and
#                            DAOS_AGENT_DRPC_DIR must then be set.
#   daos_down RUNDIR CONTAINER   for the EXIT trap: destroy CONTAINER (if DAOS was reached)
#                            and stop the system daos_up started in RUNDIR (if any).
#   daos_agent_up BIN WORK CONTAINER [BACKEND_LINE...]   agent_up on the DAOS backend with
#                            one tenant "default" on CONTAINER (more [backend] lines, e.g.
#                            create_containers = true), and that tenant's client bundle in
#                            WORK/default.
daos_up() {
    local rundir=$1 work=$2 v
    if [ -n "$rundir" ]; then
        local up=${daos_dir:?}/daos-up.sh
        [ -x "$up" ] || die "$up is missing: set DPUIO_DAOS_DIR to the directory of daos-up.sh (../shared/daos)"
        DAOS_SCM_GIB=${DAOS_SCM_GIB:-6} DAOS_POOL_SIZE=${DAOS_POOL_SIZE:-4GB} "$up" "$rundir" >"$work/daos-up.log" 2>&1 ||
            { cat "$work/daos-up.log" >&2; die "daos-up.sh $rundir failed"; }
        # shellcheck disable=SC1091
        source "$rundir/env"
    fi
    for v in DAOS_POOL DAOS_AGENT_DRPC_DIR; do
        [ -n "${!v:-}" ] || die "$v is not set: pass -d RUNDIR, or start DAOS (daos-up.sh RUNDIR) and source RUNDIR/env"
    done
}
daos_down() {
    if [ -n "${DAOS_POOL:-}" ]; then
        daos container destroy --force "$DAOS_POOL" "$2" >/dev/null 2>&1 || true
    fi
    if [ -n "$1" ]; then
        "${daos_dir:?}/daos-down.sh" "$1" >/dev/null || echo "${0##*/}: daos-down.sh $1 failed" >&2
    fi
}
daos_agent_up() {
    local bin=$1 work=$2 container=$3
    shift 3
    {
        printf '[backend]\nkind = "daos"\npool = "%s"\nagent_socket_dir = "%s"\n' "$DAOS_POOL" "$DAOS_AGENT_DRPC_DIR"
        (($#)) && printf '%s\n' "$@"
        printf '\n[[tenants]]\nname = "default"\ncontainer = "%s"\n' "$container"
    } >"$work/agent.toml"
    agent_up "$bin" "$work"
    "$bin/dpuctl" --data-dir "$work/data" cert issue --tenant default --out "$work/default" >/dev/null ||
        die "dpuctl cert issue --tenant default failed"
}
