#!/usr/bin/env bash
# A DAOS system of several engines on this machine, for the engine-fault tests: one
# daos_server with N engines (each its own RAM-backed SCM, ports and log), ofi+tcp on the
# loopback, one pool over every engine, a daos_agent for clients.
#
#   tests/daos-engines.sh up RUNDIR [ENGINES]      (root; ENGINES default 2)
#   tests/daos-engines.sh down RUNDIR
#   tests/daos-engines.sh kill RUNDIR RANK          SIGKILL one engine (an engine fault)
#   tests/daos-engines.sh restart RUNDIR RANK       start it again, wait until it joined, and
#                                                   reintegrate it into the pool
#   tests/daos-engines.sh kill-all RUNDIR           SIGKILL every engine (the whole system lost)
#   tests/daos-engines.sh start-all RUNDIR          start every engine again (dmg system start),
#                                                   wait until all joined and the pool answers
#
# Env: DAOS_PREFIX (the x86 DAOS tree, default /opt/daos; unpacked from ../shared/daos when
# missing, as daos-up.sh does), DAOS_POOL (default tank), DAOS_POOL_SIZE (default 2GB, spread
# over the engines), DAOS_SCM_GIB (each engine's tmpfs, default 4, the least DAOS accepts), DAOS_PORT (default 10001),
# DAOS_POOL_NSVC (pool service replicas, default 1: with two engines a service on both loses
# its raft majority when one dies and nothing is ever excluded; one replica on the engine
# the tests keep lets DAOS exclude the dead one and serve degraded).
# `up` writes RUNDIR/env like daos-up.sh (PATH, DAOS_AGENT_DRPC_DIR, DAOS_POOL, DAOS_PREFIX,
# DAOS_RUNDIR) plus DAOS_ENGINES and DAOS_POOL_LEADER (the rank of the pool service: the one
# a fault test must keep).
#
# Only one DAOS system may run on a machine: take /tmp/dpuio-daos.lock around its whole life.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SHARED=${DPUIO_DAOS_SHARED:-$(cd "$HERE/../.." && pwd)/shared/daos}
[ -d "$SHARED" ] || SHARED=/work/shared/daos
P=${DAOS_PREFIX:-/opt/daos}
POOL=${DAOS_POOL:-tank}
SIZE=${DAOS_POOL_SIZE:-2GB}
SCM=${DAOS_SCM_GIB:-4}
PORT=${DAOS_PORT:-10001}
NSVC=${DAOS_POOL_NSVC:-1}

say() { printf 'daos-engines: %s\n' "$*" >&2; }
die() { printf 'daos-engines: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

dmg() { "$P/bin/dmg" -o "$R/daos_control.yml" "$@"; }

# How many engines report "Joined" in `dmg system query -v`.
joined() { dmg system query -v 2>/dev/null | grep -ci joined || true; }

wait_joined() {  # wait_joined COUNT SECONDS
    local i
    for ((i = 0; i < $2; i++)); do
        [ "$(joined)" -ge "$1" ] && return 0
        kill -0 "$(cat "$R/server.pid")" 2>/dev/null || die "daos_server exited: $(tail -3 "$R/log/server.stdout")"
        sleep 1
    done
    die "only $(joined) of $1 engines joined in $2 s: see $R/log/daos_engine.*.log"
}

engine_yaml() {  # engine_yaml INDEX
    cat <<YML
  -
    targets: 1
    nr_xs_helpers: 0
    first_core: 0
    fabric_iface: lo
    fabric_iface_port: $((PORT + 21415 + 100 * $1))
    log_file: $R/log/daos_engine.$1.log
    log_mask: ERR
    env_vars:
      - FI_SOCKETS_MAX_CONN_RETRY=1
      - FI_SOCKETS_CONN_TIMEOUT=2000
      - DAOS_TARGET_OVERSUBSCRIBE=1
    storage:
      -
        class: ram
        scm_size: $SCM
        scm_mount: $R/mnt/daos$1
YML
}

up() {
    local n=${1:-2} i
    [[ "$n" =~ ^[1-9]$ ]] || die "ENGINES must be 1 to 9, not '$n'"
    [ "$(id -u)" = 0 ] || die "run as root (each engine mounts a tmpfs)"
    if [ ! -x "$P/bin/daos_server" ]; then
        # daos-up.sh installs the runtime libraries and unpacks the tree; let it, then stop.
        die "no DAOS server in $P: run $SHARED/daos-up.sh once (it unpacks DAOS and installs its libraries), or set DAOS_PREFIX"
    fi
    pgrep -x daos_server >/dev/null && die "a daos_server already runs on this machine, and only one may: stop it first"
    [ -e "$R/server.pid" ] && die "$R already holds a system (tests/daos-engines.sh down $R first)"
    mkdir -p "$R"/{log,sock,agent,mnt}
    {
        cat <<YML
name: daos_server
mgmt_svc_replicas: ['localhost']
port: $PORT
provider: ofi+tcp
socket_dir: $R/sock
control_log_file: $R/log/daos_server.log
control_log_mask: INFO
helper_log_file: $R/log/daos_server_helper.log
transport_config:
  allow_insecure: true
disable_hugepages: true
nr_hugepages: 0
system_ram_reserved: 4
engines:
YML
        for ((i = 0; i < n; i++)); do engine_yaml "$i"; done
    } >"$R/daos_server.yml"
    cat >"$R/daos_control.yml" <<YML
name: daos_server
port: $PORT
hostlist: ['localhost:$PORT']
transport_config:
  allow_insecure: true
YML
    cat >"$R/daos_agent.yml" <<YML
name: daos_server
access_points: ['localhost:$PORT']
port: $PORT
transport_config:
  allow_insecure: true
runtime_dir: $R/agent
log_file: $R/log/daos_agent.log
YML
    say "starting daos_server with $n engines (logs in $R/log)"
    "$P/bin/daos_server" start -o "$R/daos_server.yml" >"$R/log/server.stdout" 2>&1 &
    echo $! >"$R/server.pid"
    for i in $(seq 60); do
        dmg system query >/dev/null 2>&1 && break
        kill -0 "$(cat "$R/server.pid")" 2>/dev/null || die "daos_server exited: $(tail -3 "$R/log/server.stdout")"
        sleep 1
    done
    say "formatting storage"
    # Once more after a pause if it fails: in one cold CI run the format right after the
    # DAOS tier's own system stopped failed with only "1 host had errors".
    if ! dmg storage format >"$R/log/format.out" 2>&1; then
        say "dmg storage format failed; trying once more in 10 s: $(tr '\n' ' ' <"$R/log/format.out")"
        sleep 10
        dmg storage format --force >"$R/log/format.out" 2>&1 ||
            die "dmg storage format failed: $(cat "$R/log/format.out"); $(tail -5 "$R/log/server.stdout")"
    fi
    wait_joined "$n" 120
    say "starting daos_agent"
    "$P/bin/daos_agent" -o "$R/daos_agent.yml" >"$R/log/agent.stdout" 2>&1 &
    echo $! >"$R/agent.pid"
    for i in $(seq 30); do [ -S "$R/agent/daos_agent.sock" ] && break; sleep 0.5; done
    [ -S "$R/agent/daos_agent.sock" ] || die "daos_agent did not start: $(tail -3 "$R/log/agent.stdout")"
    say "creating pool $POOL ($SIZE over $n engines, $NSVC service replica(s))"
    dmg pool create --size="$SIZE" --nsvc="$NSVC" "$POOL" >"$R/log/pool.out" 2>&1 ||
        die "pool create failed: $(tail -3 "$R/log/pool.out")"
    local leader
    leader=$(dmg pool query "$POOL" 2>/dev/null | sed -n 's/.*leader=\([0-9]*\).*/\1/p' | head -n1)
    [ -n "$leader" ] || die "cannot tell the pool service's rank from 'dmg pool query $POOL'"
    cat >"$R/env" <<ENV
export PATH="$P/bin:\$PATH"
export DAOS_AGENT_DRPC_DIR="$R/agent"
export DAOS_POOL="$POOL"
export DAOS_PREFIX="$P"
export DAOS_RUNDIR="$R"
export DAOS_ENGINES=$n
export DAOS_POOL_LEADER=$leader
ENV
    say "ready: pool $POOL over $n engines, its service on rank $leader; 'source $R/env' for clients"
    cat "$R/env"
}

# The pid of the engine of RANK: the running engine that daos_server's log says started on
# that rank ("daos_engine:IDX ... process PID started on rank RANK ..."). Ranks are given in
# the order the engines join, not always that of their index (asked for rank 2, a cold run
# killed engine 2, rank 1, then restarted rank 2, which had never stopped).
engine_pid() {
    local rank=$1 pid
    for pid in $(sed -n "s/.* process \([0-9]*\) started on rank $rank .*/\1/p" "$R/log/daos_server.log" | tac); do
        if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = daos_engine ]; then
            echo "$pid"
            return 0
        fi
    done
    return 1
}

kill_engine() {
    local rank=$1 pid
    pid=$(engine_pid "$rank") || die "no running engine of rank $rank in $R"
    kill -9 "$pid"
    say "SIGKILL sent to the engine of rank $rank (pid $pid)"
}

# targets_in RANK: every target of RANK is in the pool (`Target: state up_in`).
targets_in() {
    local states
    states=$(dmg pool query-targets "$DAOS_POOL" --rank="$1" 2>/dev/null | grep "Target: state" || true)
    [ -n "$states" ] && ! grep -qv "state up_in" <<<"$states"
}

restart_engine() {
    local rank=$1 i state
    dmg system start --ranks="$rank" >"$R/log/start.$rank.out" 2>&1 ||
        die "dmg system start --ranks=$rank failed: $(tail -3 "$R/log/start.$rank.out")"
    for i in $(seq 120); do
        state=$(dmg system query --ranks="$rank" 2>/dev/null | grep -E "^\s*$rank\s" || true)
        grep -qi joined <<<"$state" && break
        sleep 1
    done
    grep -qi joined <<<"$state" || die "rank $rank did not join again in 120 s: $state"
    # DAOS excluded the dead rank from the pool; bring it back (it rebuilds onto it).
    source "$R/env"
    if dmg pool query "$DAOS_POOL" 2>/dev/null | grep -q 'disabled=[1-9]'; then
        dmg pool reintegrate "$DAOS_POOL" --ranks="$rank" >"$R/log/reint.$rank.out" 2>&1 ||
            die "dmg pool reintegrate $DAOS_POOL --ranks=$rank failed: $(tail -3 "$R/log/reint.$rank.out")"
    fi
    # Until its targets are back in the pool (up_in) and the rebuild onto them is over, the
    # pool is still degraded. "Rebuild done" alone may be the exclusion's rebuild, before the
    # reintegration's began: DAOS's own tools then abort (an assertion in reserve_grp_by_rf,
    # which counts fewer targets than domains while one is still up, not up_in).
    for i in $(seq 300); do
        targets_in "$rank" && dmg pool query "$DAOS_POOL" 2>/dev/null | grep -q "Rebuild done" && break
        sleep 1
    done
    targets_in "$rank" ||
        die "rank $rank's targets are not back in the pool 300 s after its restart: $(dmg pool query-targets "$DAOS_POOL" --rank="$rank" 2>&1 | grep -i state)"
    dmg pool query "$DAOS_POOL" 2>/dev/null | grep -q "Rebuild done" ||
        die "the rebuild onto rank $rank did not finish in 300 s: $(dmg pool query "$DAOS_POOL" 2>&1 | grep -i rebuild)"
    say "rank $rank is back"
}

kill_all() {
    local n=0 pid
    for pid in $(pgrep -x daos_engine); do
        if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q "^D_LOG_FILE=$R/"; then
            kill -9 "$pid"
            n=$((n + 1))
        fi
    done
    [ "$n" -gt 0 ] || die "no running engine of $R"
    say "SIGKILL sent to all $n engines of $R"
}

start_all() {
    local i n
    source "$R/env"
    n=$DAOS_ENGINES
    dmg system start >"$R/log/start.all.out" 2>&1 ||
        die "dmg system start failed: $(tail -3 "$R/log/start.all.out")"
    wait_joined "$n" 120
    # Every engine died at once, so no rank was excluded (the pool service died with them);
    # reintegrate any that were, then wait until the pool answers again.
    if dmg pool query "$DAOS_POOL" 2>/dev/null | grep -q 'disabled=[1-9]'; then
        for ((i = 0; i < n; i++)); do
            dmg pool reintegrate "$DAOS_POOL" --ranks="$i" >>"$R/log/reint.all.out" 2>&1 || true
        done
    fi
    for i in $(seq 120); do
        dmg pool query "$DAOS_POOL" >/dev/null 2>&1 && break
        sleep 1
    done
    dmg pool query "$DAOS_POOL" >/dev/null 2>&1 || die "pool $DAOS_POOL does not answer 120 s after the restart"
    say "all $n engines are back"
}

down() {
    [ -d "$R" ] || return 0
    [ -f "$R/daos_control.yml" ] && timeout 30 "$P/bin/dmg" -o "$R/daos_control.yml" system stop --force >/dev/null 2>&1
    local f pid m i
    for f in agent server; do
        [ -f "$R/$f.pid" ] || continue
        pid=$(cat "$R/$f.pid")
        kill "$pid" 2>/dev/null
        for i in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -9 "$pid" 2>/dev/null
        rm -f "$R/$f.pid"
    done
    for pid in $(pgrep -x daos_engine); do
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q "^D_LOG_FILE=$R/" && kill -9 "$pid"
    done
    sleep 0.5
    for m in "$R"/mnt/*; do mountpoint -q "$m" && umount -l "$m"; done
    rm -rf "$R"
}

[ $# -ge 2 ] || usage
cmd=$1 R=$2
shift 2
case "$cmd" in
    up) up "$@" ;;
    down) set +e; down ;;
    kill) [ $# = 1 ] || usage; kill_engine "$1" ;;
    restart) [ $# = 1 ] || usage; restart_engine "$1" ;;
    kill-all) [ $# = 0 ] || usage; kill_all ;;
    start-all) [ $# = 0 ] || usage; start_all ;;
    *) usage ;;
esac
