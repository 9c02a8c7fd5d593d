#!/usr/bin/env bash
# Run `dpuio bench` across two network namespaces joined by a veth pair, as two machines
# would: the agent (and the tcp-stream path's source) in "dpu", the bench in "host",
# nothing but the veth between them. The bench gets --agent, --interface and
# --stream-source for that path; the TCP transports and the tcp-stream row then take it.
# Needs root and iproute2. Everything made is removed at exit.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: host-shim/bench/netns.sh [-b BIN_DIR] -- BENCH_ARGS...

  -b BIN_DIR   holds dpu-agent, dpuio and dpuio-bench (default target/release)
  BENCH_ARGS   what `dpuio bench` gets, e.g. seq-read --paths tcp,ofi-tcp,tcp-stream --queue-depth 8
               (the script adds --agent, --interface, --stream-source and --agent-pid)

example: host-shim/bench/netns.sh -- seq-read --paths tcp,ofi-tcp,tcp-stream --queue-depth 8 --file-bytes 256MiB
EOF
}
die() { echo "netns.sh: $*" >&2; exit 2; }

bin=target/release
while getopts "b:h" opt; do
    case $opt in
        b) bin=$OPTARG ;;
        h) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
# getopts has taken the '--' already when no other argument came before it.
[ "${1:-}" != -- ] || shift
(($#)) || die "no workload after '--' (e.g. -- seq-read --paths tcp,tcp-stream)"
for b in dpu-agent dpuio dpuio-bench; do
    [ -x "$bin/$b" ] || die "$bin/$b is missing: build it (cargo build --release --bins) or pass -b DIR"
done
bin=$(cd "$bin" && pwd)
[ "$(id -u)" = 0 ] || die "network namespaces need root"
command -v ip >/dev/null || die "ip (iproute2) is missing: apt-get install iproute2"

# Names carry this shell's pid, so parallel runs do not clash and a leftover says whose.
dpu=dpuio-bench-dpu-$$ host=dpuio-bench-host-$$
dpu_if=vbd$$ host_if=vbh$$
dpu_ip=10.231.$(($$ % 250)).1 host_ip=10.231.$(($$ % 250)).2
work=$(mktemp -d /tmp/dpuio-netns.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    ip netns del "$dpu" 2>/dev/null || true
    ip netns del "$host" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$dpu" || die "cannot create a network namespace"
ip netns add "$host"
ip link add "$dpu_if" netns "$dpu" type veth peer name "$host_if" netns "$host"
ip -n "$dpu" addr add "$dpu_ip/24" dev "$dpu_if"
ip -n "$host" addr add "$host_ip/24" dev "$host_if"
for ns in "$dpu" "$host"; do ip -n "$ns" link set lo up; done
ip -n "$dpu" link set "$dpu_if" up
ip -n "$host" link set "$host_if" up
# UCX skips a device that is not operationally up yet ("network device ... is not available").
for _ in $(seq 1 100); do
    ip -n "$dpu" -o link show dev "$dpu_if" | grep -q " state UP " &&
        ip -n "$host" -o link show dev "$host_if" | grep -q " state UP " && break
    sleep 0.05
done
ip -n "$host" -o link show dev "$host_if" | grep -q " state UP " || die "the veth pair did not come up within 5 s"

printf '[data_plane]\ninterface = "%s"\n' "$dpu_if" >"$work/agent.toml"
# The agent writes its development client bundle into DPUIO_CONFIG_DIR; the bench reads it.
ip netns exec "$dpu" env DPUIO_CONFIG_DIR="$work/client" "$bin/dpu-agent" serve --data-dir "$work/data" --listen "$dpu_ip:0" \
    --config "$work/agent.toml" >"$work/agent.out" 2>"$work/agent.log" &
pids+=($!)
agent_pid=$!
ip netns exec "$dpu" "$bin/dpuio-bench" stream-source --listen "$dpu_ip:0" >"$work/source.out" &
pids+=($!)
addr="" source=""
for _ in $(seq 1 300); do
    addr=$(sed -n 's/^dpu-agent listening on \([^ ]*\).*/\1/p' "$work/agent.out" | head -n1)
    source=$(head -n1 "$work/source.out")
    [ -z "$addr" ] || [ -z "$source" ] || break
    kill -0 "$agent_pid" 2>/dev/null || { cat "$work/agent.log" >&2; die "the agent did not start"; }
    sleep 0.1
done
[ -n "$addr" ] || die "the agent did not say its address within 30 s ($work/agent.log)"
[ -n "$source" ] || die "dpuio-bench stream-source did not say its address within 30 s"
echo "netns.sh: agent $addr and stream source $source in $dpu; the bench in $host on $host_if" >&2
ip netns exec "$host" env DPUIO_CONFIG_DIR="$work/client" "$bin/dpuio" bench "$@" \
    --agent "$addr" --interface "$host_if" --stream-source "$source" --agent-pid "$agent_pid"
