#!/usr/bin/env bash
# Per-tenant DAOS workers against the in-process path, in one run: one agent on the DAOS
# backend with two tenants, "inproc" (DAOS calls in the agent) and "worker" (daos_user:
# its DAOS calls in a worker process as a user of its own), the same `dpuio bench`
# workloads as each, alternated ROUNDS times after a warm-up round; prints each row and
# the worker/in-process ratios of throughput and host CPU per GiB.
#
# Needs root (it makes the system user dpuio-bench-w), a running DAOS system whose env
# file is sourced (DAOS_POOL, DAOS_AGENT_DRPC_DIR, DAOS_RUNDIR: ../shared/daos/daos-up.sh),
# and release builds of dpu-agent, dpuio and dpuio-bench. Everything it makes (agent,
# containers) is removed at exit; the user stays.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: host-shim/bench/daos-identity.sh [-b BIN_DIR] [-r ROUNDS] [-p PATH] [-t IO_THREADS] -- BENCH_ARGS...

  -b BIN_DIR   holds dpu-agent, dpuctl, dpuio and dpuio-bench (default target/release)
  -r ROUNDS    how many times each tenant runs the workloads, alternating which goes
               first, after a warm-up round 0 that is printed but not counted (default 2)
  -p PATH      the data plane both tenants use: shm (default; the agent reads straight
               into the host's mapped memory), tcp or ofi-tcp (through the agent's
               staging, as over RDMA on a DPU)
  -t N         the agent's [data_plane] io_threads (default: the agent's, one per core)
  BENCH_ARGS   what `dpuio bench` gets (the script adds --agent, the tenant's bundle,
               --paths PATH and --json), e.g. seq-read --queue-depth 8 --file-bytes 256MiB

example: host-shim/bench/daos-identity.sh -- seq-read --queue-depth 8 --file-bytes 256MiB --seconds 5
EOF
}
die() { echo "daos-identity.sh: $*" >&2; exit 2; }

bin=target/release
rounds=2
path=shm
io_threads=
while getopts "b:r:p:t:h" opt; do
    case $opt in
        b) bin=$OPTARG ;;
        r) rounds=$OPTARG ;;
        p) path=$OPTARG ;;
        t) io_threads=$OPTARG ;;
        h) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" != -- ] || shift
(($#)) || die "no workload after '--' (e.g. -- seq-read --queue-depth 8)"
case $path in shm | tcp | ofi-tcp) ;; *) die "-p $path: use shm, tcp or ofi-tcp" ;; esac
# The agent checks the range itself (and agent_up shows its error).
[[ -z $io_threads || $io_threads =~ ^[0-9]+$ ]] || die "-t $io_threads: give a number of I/O threads"
for b in dpu-agent dpuctl dpuio dpuio-bench; do
    [ -x "$bin/$b" ] || die "$bin/$b is missing: build it (cargo build --release --bins) or pass -b DIR"
done
bin=$(cd "$bin" && pwd)
[ "$(id -u)" = 0 ] || die "making the tenant's DAOS user needs root"
for v in DAOS_POOL DAOS_AGENT_DRPC_DIR DAOS_RUNDIR; do
    [ -n "${!v:-}" ] || die "$v is not set: start DAOS (../shared/daos/daos-up.sh RUNDIR) and source RUNDIR/env"
done
command -v python3 >/dev/null || die "python3 is missing (apt-get install python3)"

user=dpuio-bench-w
id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
dmg -o "$DAOS_RUNDIR/daos_control.yml" pool update-acl "$DAOS_POOL" --entry "A::$user@:rw" >/dev/null ||
    die "dmg pool update-acl failed: is $DAOS_RUNDIR/daos_control.yml the running system's?"

work=$(mktemp -d)
tag=$$
agent_pid=
cleanup() {
    if [ -n "$agent_pid" ]; then kill -9 "$agent_pid" 2>/dev/null || true; wait "$agent_pid" 2>/dev/null || true; fi
    daos container destroy --force "$DAOS_POOL" "idb-in-$tag" >/dev/null 2>&1 || true
    runuser -u "$user" -- daos container destroy --force "$DAOS_POOL" "idb-w-$tag" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/agent.toml" <<EOF
[backend]
kind = "daos"
pool = "$DAOS_POOL"
agent_socket_dir = "$DAOS_AGENT_DRPC_DIR"
create_containers = true
${io_threads:+
[data_plane]
io_threads = $io_threads
}
[[tenants]]
name = "inproc"
container = "idb-in-$tag"

[[tenants]]
name = "worker"
container = "idb-w-$tag"
daos_user = "$user"
EOF
# shellcheck source=host-shim/bench/agent-up.sh
source "$(dirname "${BASH_SOURCE[0]}")/agent-up.sh"
agent_up "$bin" "$work"
for t in inproc worker; do
    "$bin/dpuctl" --data-dir "$work/data" cert issue --tenant "$t" --out "$work/$t" >/dev/null ||
        die "dpuctl cert issue --tenant $t failed"
done

# Round 0 warms up (the agent's first reads of a new file ran 10%-40% slower than every
# later round here, and it was always the in-process tenant's: that biased the ratio up);
# it is printed but not counted. The tenants then take turns going first.
for round in $(seq 0 "$rounds"); do
    order="inproc worker"
    ((round % 2)) || order="worker inproc"
    for t in $order; do
        DPUIO_CONFIG_DIR="$work/$t" "$bin/dpuio" bench --agent "$addr" --paths "$path" --json --agent-pid "$agent_pid" "$@" |
            sed "s/^{/{\"tenant\":\"$t\",\"round\":$round,/" >>"$work/rows.json"
    done
done

python3 - "$work/rows.json" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"{'workload':<12} {'tenant':<7} {'round':>5} {'GiB/s':>8} {'IOPS':>10} {'host s/GiB':>11}")
for r in rows:
    print(f"{r['workload']:<12} {r['tenant']:<7} {r['round']:>5} {r['gib_per_s'] or 0:>8.3f} {r['iops']:>10.0f} "
          f"{r['host_cpu_s_per_gib'] or 0:>11.4f}")
print()
for w in dict.fromkeys(r["workload"] for r in rows):
    def mean(t, k):
        v = [r[k] for r in rows if r["workload"] == w and r["tenant"] == t and r["round"] > 0 and r[k]]
        return sum(v) / len(v) if v else float("nan")
    rate = "gib_per_s" if any(r["gib_per_s"] for r in rows if r["workload"] == w) else "iops"
    print(f"{w}: worker/in-process throughput {mean('worker', rate) / mean('inproc', rate):.3f}x, "
          f"host CPU per GiB {mean('worker', 'host_cpu_s_per_gib') / mean('inproc', 'host_cpu_s_per_gib'):.3f}x")
EOF
