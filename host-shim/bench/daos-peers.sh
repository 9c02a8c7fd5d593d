#!/usr/bin/env bash
# dpuio against DAOS's own host clients, in one run: a DAOS system of its own (or the
# running one whose env file is sourced), one dpu-agent on the DAOS backend serving one
# tenant's container, and `dpuio bench --backend daos` with the paths libdfs, dfuse,
# pil4dfs (DAOS's) and shim, preload, fuse (dpuio's) on that container's files.
#
# Only one DAOS system may run on a machine: run it under the shared lock, e.g.
#   flock /tmp/dpuio-daos.lock host-shim/bench/daos-peers.sh -- seq-read --seconds 2
# Everything it starts (DAOS system, agent, dfuse mounts) is stopped at exit.
set -euo pipefail

usage() {
    cat <<'EOF2'
usage: host-shim/bench/daos-peers.sh [-b BIN_DIR] [-d RUNDIR] [-p PATHS] -- BENCH_ARGS...

  -b BIN_DIR   holds dpu-agent, dpuctl, dpuio, dpuio-bench, dpuio-bench-agent and
               libdpuio_preload.so (default target/release)
  -d RUNDIR    start a DAOS system of its own there with ../shared/daos/daos-up.sh
               ($DPUIO_DAOS_DIR) and stop it at exit (default: use the running one, whose env file is sourced:
               DAOS_POOL, DAOS_AGENT_DRPC_DIR)
  -p PATHS     --paths of dpuio bench (default libdfs,dfuse,pil4dfs,shim,preload,fuse)
  BENCH_ARGS   what `dpuio bench` gets besides --agent, --backend daos, the pool, the
               container, --paths and --agent-pid, e.g. seq-read --queue-depth 8; ':::'
               between parts runs one bench per part on the same agent and container

example: flock /tmp/dpuio-daos.lock host-shim/bench/daos-peers.sh -d /tmp/peers-daos -- \
             seq-read rand-read metadata unet3d checkpoint --file-bytes 256MiB --seconds 2 \
             ::: seq-read --queue-depth 8 --file-bytes 256MiB --seconds 2
EOF2
}
die() { echo "daos-peers.sh: $*" >&2; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
# The DAOS test system's scripts (the repository's ../shared/daos).
daos_dir=${DPUIO_DAOS_DIR:-$(cd "$here/../../.." && pwd)/shared/daos}
bin=target/release
rundir=
paths=libdfs,dfuse,pil4dfs,shim,preload,fuse
while getopts "b:d:p:h" opt; do
    case $opt in
        b) bin=$OPTARG ;;
        d) rundir=$OPTARG ;;
        p) paths=$OPTARG ;;
        h) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" != -- ] || shift
(($#)) || die "no workload after '--' (e.g. -- seq-read --queue-depth 8)"
for b in dpu-agent dpuctl dpuio dpuio-bench dpuio-bench-agent libdpuio_preload.so; do
    [ -e "$bin/$b" ] ||
        die "$bin/$b is missing: build it (cargo build --release --bins; cargo build --release -p dpuio-preload) or pass -b DIR"
done
# `cargo build --bins` leaves the preload library as it was: a stale one measures old code.
if [ "$bin/libdpuio_preload.so" -ot "$bin/dpuio" ]; then
    echo "daos-peers.sh: warning: $bin/libdpuio_preload.so is older than $bin/dpuio;" \
        "the preload row measures that older build (cargo build --release -p dpuio-preload)" >&2
fi
bin=$(cd "$bin" && pwd)
[ -e /dev/fuse ] || die "/dev/fuse is missing: dfuse and dpuio mount need FUSE"
command -v fusermount3 >/dev/null || die "fusermount3 is missing (apt-get install fuse3)"

work=$(mktemp -d)
agent_pid=
container=peers-$$
cleanup() {
    if [ -n "$agent_pid" ]; then
        kill "$agent_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$agent_pid" 2>/dev/null || true
    fi
    # A bench killed before its own clean-up leaves mounts behind.
    for m in $(awk '$2 ~ /dpuio-bench-(dfuse|fuse)-/ {print $2}' /proc/self/mounts); do
        fusermount3 -uz "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    daos_down "$rundir" "$container"
    rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=host-shim/bench/agent-up.sh
source "$(dirname "${BASH_SOURCE[0]}")/agent-up.sh"

# Every path writes a checkpoint and DAOS reclaims removed files' space later: daos-up.sh's
# own 2 GB pool runs out with 256 MiB checkpoints (daos_up makes a 4 GB one).
daos_up "$rundir" "$work"
daos_agent_up "$bin" "$work" "$container" "create_containers = true"

bench() {
    echo "+ dpuio bench $* (machine load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores)"
    DPUIO_CONFIG_DIR="$work/default" "$bin/dpuio" bench --agent "$addr" --backend daos --daos-pool "$DAOS_POOL" \
        --daos-container "$container" --daos-agent-socket-dir "$DAOS_AGENT_DRPC_DIR" --paths "$paths" \
        --agent-pid "$agent_pid" "$@"
}
# One bench run per ':::'-separated part, on the same agent and container.
part=()
for a in "$@"; do
    if [ "$a" = ::: ]; then
        ((${#part[@]})) && bench "${part[@]}"
        part=()
    else
        part+=("$a")
    fi
done
((${#part[@]})) && bench "${part[@]}"
echo "machine load after: $(cut -d' ' -f1-3 /proc/loadavg)"
