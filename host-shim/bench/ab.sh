#!/usr/bin/env bash
# Compare builds of dpuio in one series: each round starts each build's agent on a fresh
# data directory and runs the same `dpuio bench` with that build's CLI, the builds taking
# turns, so a slow drift of a shared machine falls on all of them alike. One JSON line per
# result goes to OUT (with the build's label and the round), and a summary per workload,
# path and build (the range over the rounds) is printed at the end.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: host-shim/bench/ab.sh [-r ROUNDS] [-o OUT] LABEL=BIN_DIR LABEL=BIN_DIR... -- BENCH_ARGS...

  LABEL=BIN_DIR   a build: BIN_DIR holds its dpu-agent, dpuio and dpuio-bench
                  (e.g. old=/tmp/old/target/release new=target/release); at least two
  -r ROUNDS       rounds of the whole set (default 3)
  -o OUT          the JSON lines (default ab-results.jsonl; appended to)
  BENCH_ARGS      what `dpuio bench` gets, e.g. seq-read rand-read --paths posix,shm --rounds 2
                  (the script adds --posix-root, --agent-pid and --json)

example: host-shim/bench/ab.sh old=/tmp/old/target/release new=target/release -- metadata --paths shm
EOF
}
die() { echo "ab.sh: $*" >&2; exit 2; }

rounds=3 out=ab-results.jsonl
while getopts "r:o:h" opt; do
    case $opt in
        r) rounds=$OPTARG ;;
        o) out=$OPTARG ;;
        h) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
labels=()
declare -A dir
while (($#)) && [ "$1" != -- ]; do
    [[ $1 == *=* ]] || die "a build is LABEL=BIN_DIR, not '$1' (see --help: -h)"
    label=${1%%=*} bin=${1#*=}
    [[ $label =~ ^[A-Za-z0-9_.-]+$ ]] || die "label '$label': letters, digits, '.', '_' and '-' only"
    for b in dpu-agent dpuio dpuio-bench; do
        [ -x "$bin/$b" ] || die "$bin/$b is missing: build it (cargo build --release --bins) or name another directory"
    done
    [ -z "${dir[$label]:-}" ] || die "label '$label' is given twice"
    labels+=("$label") dir[$label]=$(cd "$bin" && pwd)
    shift
done
((${#labels[@]} >= 2)) || { usage >&2; die "name at least two builds"; }
[ "${1:-}" = -- ] || die "the bench's arguments follow '--'"
shift
(($#)) || die "no workload after '--' (e.g. -- seq-read --paths posix,shm)"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "-r wants a positive number of rounds, not '$rounds'"

work=""
agent=""
cleanup() {
    [ -z "$agent" ] || { kill -TERM "$agent" 2>/dev/null; wait "$agent" 2>/dev/null || true; }
    [ -z "$work" ] || rm -rf "$work"
}
trap cleanup EXIT

for round in $(seq 1 "$rounds"); do
    for label in "${labels[@]}"; do
        bin=${dir[$label]}
        work=$(mktemp -d /tmp/dpuio-ab.XXXXXX)
        DPUIO_CONFIG_DIR="$work/client" "$bin/dpu-agent" serve --data-dir "$work/data" --listen 127.0.0.1:0 \
            >"$work/agent.out" 2>"$work/agent.log" &
        agent=$!
        addr=""
        for _ in $(seq 1 300); do
            addr=$(sed -n 's/^dpu-agent listening on \([^ ]*\).*/\1/p' "$work/agent.out" | head -n1)
            [ -z "$addr" ] || break
            kill -0 "$agent" 2>/dev/null || { cat "$work/agent.log" >&2; die "$label: the agent did not start"; }
            sleep 0.1
        done
        [ -n "$addr" ] || die "$label: the agent did not say its address within 30 s ($work/agent.log)"
        echo "== round $round: $label ($bin)" >&2
        DPUIO_CONFIG_DIR="$work/client" DPUIO_AGENT=$addr "$bin/dpuio" bench "$@" \
            --posix-root "$work/data/containers/default" --agent-pid "$agent" --json |
            sed "s/^{/{\"build\":\"$label\",\"round\":$round,/" >>"$out"
        kill -TERM "$agent"
        wait "$agent" || true
        agent=""
        rm -rf "$work"
        work=""
    done
done

python3 - "$out" "${labels[@]}" <<'EOF'
import collections, json, sys
path, labels = sys.argv[1], sys.argv[2:]
rows = collections.defaultdict(list)
for line in open(path):
    r = json.loads(line)
    if r.get("build") in labels:
        rows[(r["workload"], r["path"], r["build"])].append(r)
def span(rs, key, fmt):
    v = sorted(x[key] for x in rs if x.get(key) is not None)
    return "" if not v else fmt(v[0]) if v[0] == v[-1] else f"{fmt(v[0])}-{fmt(v[-1])}"
print(f"{'workload':28} {'path':14} {'build':8} {'GiB/s':>12} {'ops/s':>16} {'host CPU s/GiB':>16} {'agent CPU s/GiB':>16}")
for (workload, p, build) in sorted(rows, key=lambda k: (k[0], k[1], labels.index(k[2]))):
    rs = rows[(workload, p, build)]
    print(f"{workload:28} {p:14} {build:8} {span(rs, 'gib_per_s', lambda x: f'{x:.2f}'):>12} "
          f"{span(rs, 'iops', lambda x: f'{x:,.0f}'):>16} {span(rs, 'host_cpu_s_per_gib', lambda x: f'{x:.4f}'):>16} "
          f"{span(rs, 'agent_cpu_s_per_gib', lambda x: f'{x:.3f}'):>16}")
print(f"(the range over the rounds; every run in {path})")
EOF
