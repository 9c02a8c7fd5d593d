# Sourced by the bench scripts (daos-identity.sh, daos-peers.sh): start the agent.
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
