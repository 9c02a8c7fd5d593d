#!/usr/bin/env bash
# The DLIO benchmark, unmodified (PyPI dlio-benchmark, its own data generator and its stock
# npz reader), for unet3d, read five ways on the same bytes: local files, dpuio's preload
# library and `dpuio mount` (one dpu-agent on the DAOS backend serving one container), and
# DAOS's own dfuse and libpil4dfs on that container. Per path: DLIO's accelerator
# utilisation (AU) and samples/s, the host CPU of the training window (every DLIO process,
# its reader workers included, plus the dfuse or `dpuio mount` daemon the path reads
# through) and the agent's CPU (DPU CPU, apart).
#
# Only one DAOS system may run on a machine: run it under the shared lock, e.g.
#   flock /tmp/dpuio-daos.lock host-shim/bench/dlio.sh -d /tmp/dlio-daos
# `./x dlio` installs what it needs (MPI, DLIO in a venv), builds, and runs this so.
# Everything it starts (DAOS system, agent, dfuse, dpuio mount) is stopped at exit.
set -euo pipefail

usage() {
    cat <<'EOF2'
usage: host-shim/bench/dlio.sh [-b BIN_DIR] [-d RUNDIR] [-p PATHS] [-r ROUNDS] [-n RANKS] [-o OUT] [-- OVERRIDES...]

  -b BIN_DIR  holds dpu-agent, dpuctl, dpuio and libdpuio_preload.so (default target/release)
  -d RUNDIR   start a DAOS system of its own there with ../shared/daos/daos-up.sh
              ($DPUIO_DAOS_DIR) and stop it at exit (default: use the running one, whose env
              file is sourced: DAOS_POOL, DAOS_AGENT_DRPC_DIR)
  -p PATHS    which of local,preload,fuse,dfuse,pil4dfs to run, in that order within a round
              (default all five)
  -r ROUNDS   rounds over the paths (default 2): the spread of each figure
  -n RANKS    MPI ranks, DLIO's simulated accelerators (default 1)
  -o OUT      the table of figures, tab-separated, one line per run (default dlio-results.tsv)
  OVERRIDES   more Hydra overrides for every DLIO run, after this script's (later wins),
              e.g. ++workload.train.epochs=5

DLIO comes from $DPUIO_DLIO_VENV (default ~/.cache/dpuio/dlio-venv), which ./x dlio makes.
The workload is DLIO's stock unet3d_h100 scaled down by overrides only: 84 files of 16 MiB
mean (stdev in proportion to the stock one), 3 epochs, the H100 step time scaled by the
sample size (0.323 s x 16 MiB / 139.8 MiB = 0.037 s), no checkpoint.
EOF2
}
die() { echo "dlio.sh: $*" >&2; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
daos_dir=${DPUIO_DAOS_DIR:-$(cd "$here/../../.." && pwd)/shared/daos}
venv=${DPUIO_DLIO_VENV:-$HOME/.cache/dpuio/dlio-venv}
bin=target/release
rundir=
paths=local,preload,fuse,dfuse,pil4dfs
rounds=2
ranks=1
out=dlio-results.tsv
while getopts "b:d:p:r:n:o:h" opt; do
    case $opt in
        b) bin=$OPTARG ;;
        d) rundir=$OPTARG ;;
        p) paths=$OPTARG ;;
        r) rounds=$OPTARG ;;
        n) ranks=$OPTARG ;;
        o) out=$OPTARG ;;
        h) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" != -- ] || shift
overrides=("$@")
for p in ${paths//,/ }; do
    case $p in local | preload | fuse | dfuse | pil4dfs) ;; *) die "unknown path '$p' in -p (local, preload, fuse, dfuse, pil4dfs)" ;; esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "-r wants a number of rounds, not '$rounds'"
[[ $ranks =~ ^[1-9][0-9]*$ ]] || die "-n wants a number of MPI ranks, not '$ranks'"
for b in dpu-agent dpuctl dpuio libdpuio_preload.so; do
    [ -e "$bin/$b" ] || die "$bin/$b is missing: build it (cargo build --release --bins -p dpu-agent -p host-shim; cargo build --release -p dpuio-preload) or pass -b DIR"
done
bin=$(cd "$bin" && pwd)
[ -x "$venv/bin/dlio_benchmark" ] || die "DLIO is not installed in $venv: run ./x dlio (it makes the venv), or set DPUIO_DLIO_VENV"
command -v mpirun >/dev/null || die "mpirun is missing (apt-get install openmpi-bin libopenmpi-dev)"
[ -x /usr/bin/time ] || die "/usr/bin/time is missing (apt-get install time)"
[ -e /dev/fuse ] || die "/dev/fuse is missing: dfuse and dpuio mount need FUSE"
command -v fusermount3 >/dev/null || die "fusermount3 is missing (apt-get install fuse3)"
out=$(realpath -m "$out")

work=$(mktemp -d /tmp/dpuio-dlio.XXXXXX)
agent_pid='' dfuse_pid='' fuse_pid='' dlio_pid=''
container=dlio-$$
stop() {  # stop PID: SIGTERM, then SIGKILL after 5 s
    kill "$1" 2>/dev/null || return 0
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$1" 2>/dev/null || true
}
cleanup() {
    # A DLIO run cut short (mpirun, its ranks and reader workers) first: it holds the mounts.
    if [ -n "$dlio_pid" ]; then
        local p
        for p in $(tree "$dlio_pid" pids); do kill "$p" 2>/dev/null || true; done
        sleep 1
        for p in $(tree "$dlio_pid" pids); do kill -9 "$p" 2>/dev/null || true; done
    fi
    [ -z "$fuse_pid" ] || stop "$fuse_pid"
    [ -z "$dfuse_pid" ] || { fusermount3 -u "$work/dfuse" 2>/dev/null || true; stop "$dfuse_pid"; }
    # A daemon that died leaves a mount whose stat fails: look in the mount table, not at it.
    for m in "$work/fuse" "$work/dfuse"; do
        ! grep -q " $m fuse" /proc/self/mounts || fusermount3 -uz "$m" 2>/dev/null || umount -l "$m" || true
    done
    [ -z "$agent_pid" ] || stop "$agent_pid"
    daos_down "$rundir" "$container"
    rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=host-shim/bench/agent-up.sh
source "$here/agent-up.sh"

# The container holds one copy of the data set (about 1.4 GB): the 4 GB pool leaves room.
daos_up "$rundir" "$work"
command -v dfuse >/dev/null || die "dfuse is not on PATH: source the DAOS env file (RUNDIR/env) or pass -d RUNDIR"
pil4dfs=${DPUIO_PIL4DFS_LIBRARY:-$(dirname "$(dirname "$(command -v dfuse)")")/lib64/libpil4dfs.so}
[ -f "$pil4dfs" ] || die "$pil4dfs not found: set DPUIO_PIL4DFS_LIBRARY to DAOS's libpil4dfs.so"
daos container create "$DAOS_POOL" "$container" --type=POSIX >"$work/cont.log" 2>&1 ||
    { cat "$work/cont.log" >&2; die "daos container create $DAOS_POOL $container failed (is the pool full or DAOS down?)"; }

# One agent on the DAOS backend, serving the container to the tenant "default".
daos_agent_up "$bin" "$work" "$container"

# wait_mounted DIR PID WHAT LOG: until the kernel lists DIR, or PID (the daemon, its output
# in LOG) has exited.
wait_mounted() {
    for _ in $(seq 600); do
        mountpoint -q "$1" && return 0
        kill -0 "$2" 2>/dev/null || { tail -20 "$4" >&2; die "$3 exited before mounting $1 (its output is above)"; }
        sleep 0.1
    done
    tail -20 "$4" >&2
    die "$3 did not mount $1 within 60 s (its output is above)"
}
# `dpuio mount` keeps a file's pages while it is unchanged (its design): a mount of its own
# for each fuse run, so that every run starts reading DAOS, as the other paths do.
fuse_up() {
    env -u LD_LIBRARY_PATH DPUIO_CONFIG_DIR="$work/default" "$bin/dpuio" mount "$work/fuse" --agent "$addr" --foreground \
        </dev/null >>"$work/fuse.log" 2>&1 &
    fuse_pid=$!
    wait_mounted "$work/fuse" "$fuse_pid" "dpuio mount" "$work/fuse.log"
}
fuse_down() {
    # Unmounting ends `dpuio mount --foreground`; one still there after 10 s is stopped.
    fusermount3 -u "$work/fuse" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$fuse_pid" 2>/dev/null || break; sleep 0.1; done
    stop "$fuse_pid"
    fuse_pid=''
    ! grep -q " $work/fuse fuse" /proc/self/mounts || fusermount3 -uz "$work/fuse" ||
        die "$work/fuse is still mounted after dpuio mount stopped, and fusermount3 -uz failed"
}
# dfuse without caching, as the bench's dfuse rows: every epoch reads DAOS, not the page cache.
mkdir -p "$work/dfuse" "$work/fuse"
DAOS_AGENT_DRPC_DIR=$DAOS_AGENT_DRPC_DIR dfuse "$work/dfuse" "$DAOS_POOL" "$container" --foreground --disable-caching \
    </dev/null >"$work/dfuse.log" 2>&1 &
dfuse_pid=$!
wait_mounted "$work/dfuse" "$dfuse_pid" "dfuse $DAOS_POOL $container" "$work/dfuse.log"

# DLIO's stock unet3d (H100 profile), scaled down by overrides only; see usage.
workload=(workload=unet3d_h100 ++workload.workflow.checkpoint=False
    ++workload.dataset.num_files_train=84 ++workload.dataset.record_length=16777216
    ++workload.dataset.record_length_stdev=7821000 ++workload.train.epochs=3
    ++workload.train.computation_time=0.037 "${overrides[@]}")
epochs=3
for o in "${overrides[@]}"; do [[ $o != *workload.train.epochs=* ]] || epochs=${o##*=}; done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
# dlio RUN FOLDER MPIRUN_ARGS... -- OVERRIDES...: one DLIO run under mpirun (no core binding:
# the reader workers may use every core), its output in $work/RUN; DLIO's log on stdout.
# DAOS's LD_LIBRARY_PATH (its libfabric, mercury) only for runs that load libpil4dfs.
dlio() {
    local run=$1 folder=$2
    shift 2
    local mpi=() keep=(-u LD_LIBRARY_PATH)
    while [ "$1" != -- ]; do mpi+=("$1"); shift; done
    shift
    [[ ${mpi[*]} != *libpil4dfs* ]] || keep=()
    mkdir -p "$work/$run"
    (cd "$work/$run" && exec env "${keep[@]}" /usr/bin/time -o "$work/$run/time" -f "%U %S %e" mpirun -np "$ranks" --bind-to none "${mpi[@]}" \
        "$venv/bin/dlio_benchmark" "${workload[@]}" ++workload.dataset.data_folder="$folder" \
        ++workload.output.folder="$work/$run/out" "$@")
}

# Generated once, by DLIO's own generator, on local disk; copied with cp through dfuse into
# the container (the same bytes, checked with cmp), which the other four paths read.
echo "== generating the data set with DLIO's generator into $work/local (then copied into DAOS container $container)"
dlio gen "$work/local" -- ++workload.workflow.generate_data=True ++workload.workflow.train=False >"$work/gen.log" 2>&1 ||
    { tail -30 "$work/gen.log" >&2; die "DLIO's data generation failed (its log is above)"; }
cp -r "$work/local/train" "$work/local/valid" "$work/dfuse/" || die "copying the data set into the container through dfuse failed"
for f in "$work/local/train/"*; do
    cmp -s "$f" "$work/dfuse/train/${f##*/}" || die "${f##*/} differs between local disk and the container after the copy"
done
echo "$(find "$work/local/train" -type f | wc -l) files, $(du -sm "$work/local/train" | cut -f1) MiB"

# tree PID ticks|pids: the CPU ticks of PID and its descendants, with their reaped children's;
# or their pids. A process may end between the listing of /proc and the read of its stat.
tree() {
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v root="$1" -v what="$2" '
        { pid = $1; sub(/^[0-9]+ \(.*\) /, ""); ppid[pid] = $2; t[pid] = $12 + $13 + $14 + $15 }
        END {
            in_tree[root] = 1
            do { grown = 0; for (p in ppid) if (!(p in in_tree) && (ppid[p] in in_tree)) { in_tree[p] = 1; grown = 1 } } while (grown)
            for (p in in_tree) if (p in t) { sum += t[p]; if (what == "pids") print p }
            if (what == "ticks") print sum + 0
        }'
}
tree_ticks() { tree "$1" ticks; }
hz=$(getconf CLK_TCK)
cpu_s() { awk -v t="$1" -v hz="$hz" 'BEGIN { printf "%.2f", t / hz }'; }

# measure PATH ROUND: one training run of DLIO through PATH. The host CPU of the training
# window (from DLIO's "Starting epoch 1" to "Ending epoch N" lines) is the DLIO processes'
# plus the daemon of the path (dfuse for dfuse and pil4dfs, dpuio mount for fuse).
measure() {
    local path=$1 round=$2 folder daemon="" mpi=()
    case $path in
        local) folder=$work/local ;;
        preload)
            folder=/dpuio-dlio
            mpi=(-x LD_PRELOAD="$bin/libdpuio_preload.so" -x DPUIO_MOUNT=/dpuio-dlio -x DPUIO_AGENT="$addr"
                -x DPUIO_CONFIG_DIR="$work/default" -x UCX_MEM_MMAP_HOOK_MODE=none) ;;
        fuse) fuse_up; folder=$work/fuse daemon=$fuse_pid ;;
        dfuse) folder=$work/dfuse daemon=$dfuse_pid ;;
        pil4dfs) folder=$work/dfuse daemon=$dfuse_pid mpi=(-x LD_PRELOAD="$pil4dfs" -x DAOS_AGENT_DRPC_DIR) ;;
    esac
    local run=$path-$round fifo=$work/$path-$round.fifo
    mkfifo "$fifo"
    dlio "$run" "$folder" "${mpi[@]}" -- ++workload.workflow.generate_data=False ++workload.workflow.train=True \
        >"$fifo" 2>&1 &
    local pid=$! line a0 a1 d0=0 d1=0 h0="" h1="" ok=0
    dlio_pid=$pid
    a0=$(tree_ticks "$agent_pid")
    [ -z "$daemon" ] || d0=$(tree_ticks "$daemon")
    while IFS= read -r line; do
        printf '%s\n' "$line" >>"$work/$run.log"
        case $line in
            *"Starting epoch 1:"*) h0=$(tree_ticks "$pid"); [ -z "$daemon" ] || d0=$(tree_ticks "$daemon"); a0=$(tree_ticks "$agent_pid") ;;
            *"Ending epoch $epochs - "*)
                h1=$(tree_ticks "$pid"); [ -z "$daemon" ] || d1=$(tree_ticks "$daemon"); a1=$(tree_ticks "$agent_pid") ;;
        esac
    done <"$fifo"
    wait "$pid" || ok=$?
    dlio_pid=''
    rm -f "$fifo"
    [ "$path" != fuse ] || fuse_down
    local summary=$work/$run/out/summary.json
    if [ "$ok" != 0 ] || [ ! -f "$summary" ] || [ -z "$h0" ] || [ -z "$h1" ]; then
        tail -40 "$work/$run.log" >&2
        die "DLIO through $path (round $round) failed: exit $ok, summary ${summary##*/} $([ -f "$summary" ] && echo present || echo missing) (DLIO's log is above)"
    fi
    # DLIO's own figures from its summary.json; the whole run's CPU from /usr/bin/time.
    local figures whole
    figures=$("$venv/bin/python" -c 'import json, sys
s = json.load(open(sys.argv[1]))
m = s["metric"]
print("%.1f\t%.1f\t%d\t%s" % (m["train_au_mean_percentage"], m["train_throughput_mean_samples_per_second"],
      s["num_files_train"] * s["num_samples_per_file"] * s["epochs"], "/".join("%.0f" % a for a in m["train_au_percentage"])))' "$summary")
    whole=$(awk '{ printf "%.2f", $1 + $2 }' "$work/$run/time")
    local host=$((h1 - h0 + d1 - d0)) au rate samples per_epoch
    IFS=$'\t' read -r au rate samples per_epoch <<<"$figures"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$path" "$round" "$au" "$per_epoch" "$rate" "$(cpu_s "$host")" \
        "$(awk -v t="$host" -v hz="$hz" -v n="$samples" 'BEGIN { printf "%.1f", 1000 * t / hz / n }')" \
        "$(cpu_s $((d1 - d0)))" "$(cpu_s $((a1 - a0)))" "$whole" | tee -a "$out"
}

printf 'path\tround\tAU %%\tAU per epoch\tsamples/s\thost CPU s (train)\thost CPU ms/sample\tof which daemon s\tagent CPU s\tDLIO CPU s (whole run, start-up included)\n' | tee "$out"
echo "== DLIO unet3d through each path; machine load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores" >&2
for round in $(seq "$rounds"); do
    for p in ${paths//,/ }; do
        measure "$p" "$round"
    done
done
echo "machine load after: $(cut -d' ' -f1-3 /proc/loadavg); figures in $out" >&2
