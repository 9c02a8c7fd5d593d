"""Benchmark: the dpuio Dataset against the plain POSIX Dataset (``np.load`` on files in
a directory, where pydaos's documentation starts) on the same files, with the same
DataLoader settings, in one run.

    cargo build --release -p dpu-agent
    (cd host-shim/python && maturin develop --release)
    python examples/python/bench_dataset.py --agent-bin target/release/dpu-agent

It starts its own agent on a fresh data directory, writes ``--samples`` .npy files of
``--sample-kib`` into the agent's container, and reads them both ways, alternating,
``--epochs`` times each:

* posix: ``torch.from_numpy(np.load(path))`` per sample, from the container's directory
  on the local file system (what a job does without dpuio);
* dpuio: ``dpuio.torch.Dataset(transform_fn=dpuio.torch.tensor_npy)``: each worker asks
  the agent for a whole batch in one submission; the agent puts the bytes into the
  worker's registered memory, and the tensors are views of it.

Per epoch it prints samples/s, GiB/s, host CPU per GiB (the main process and the
DataLoader workers: /proc/<pid>/stat), and the agent's CPU per GiB (on a real system
that CPU is the DPU's, not the host's). The files are read once beforehand so both
read from the page cache. The summary leaves out each side's first epoch (workers
starting, files opening, regions registering).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import dpuio
import dpuio.torch

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class PosixDataset(torch.utils.data.Dataset):
    """The starting point of pydaos's documentation: np.load on files in a directory."""

    def __init__(self, root):
        self.files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return torch.from_numpy(np.load(self.files[i]))


def start_agent(binary, data_dir, config_dir):
    """An agent of this run's own; it and this process's clients share ``config_dir`` as
    ``DPUIO_CONFIG_DIR`` (where an agent writes its development client bundle)."""
    os.makedirs(config_dir, exist_ok=True)
    os.environ["DPUIO_CONFIG_DIR"] = config_dir  # for the clients made below, and the workers
    proc = subprocess.Popen([binary, "serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "RUST_LOG": "warn"})
    m = re.match(r"dpu-agent listening on (\S+)", proc.stdout.readline())
    if not m:
        proc.kill()
        raise SystemExit("the agent did not start")
    return proc, m.group(1)


def run_epoch(loader, compute_s, agent_pid):
    """One epoch; returns (samples, bytes, wall, host cpu, agent cpu)."""
    it = iter(loader)  # persistent workers start at the first epoch and stay
    workers = [w.pid for w in getattr(it, "_workers", [])]
    host0 = time.process_time() + sum(cpu_seconds(p) for p in workers)
    agent0 = cpu_seconds(agent_pid)
    t0 = time.perf_counter()
    samples = nbytes = 0
    for batch in it:
        for t in batch if isinstance(batch, list) else [batch]:
            samples += t.shape[0] if not isinstance(batch, list) else 1
            nbytes += t.numel() * t.element_size()
        if compute_s:
            time.sleep(compute_s)
    wall = time.perf_counter() - t0
    host = time.process_time() + sum(cpu_seconds(p) for p in workers) - host0
    return samples, nbytes, wall, host, cpu_seconds(agent_pid) - agent0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent-bin", default="target/release/dpu-agent")
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--sample-kib", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4, help="epochs per side")
    p.add_argument("--compute-ms", type=float, default=0.0, help="sleep per batch in the training loop")
    p.add_argument("--transport", default=os.environ.get("DPUIO_TRANSPORT", "auto"))
    p.add_argument("--collate", choices=["stack", "list"], default="stack",
                   help="stack: torch's default (copies the batch into one tensor); list: no copy, "
                        "to see the dataset's own cost (with --workers 0)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="intra-op threads of the main process (idle OpenMP threads spin and would "
                        "count as CPU on both sides)")
    args = p.parse_args()
    torch.set_num_threads(args.torch_threads)

    with tempfile.TemporaryDirectory(prefix="dpuio-bench-") as tmp:
        agent, addr = start_agent(args.agent_bin, os.path.join(tmp, "data"), os.path.join(tmp, "config"))
        try:
            root = os.path.join(tmp, "data", "containers", "default", "bench")
            os.makedirs(root)
            floats = args.sample_kib * 1024 // 4
            rng = np.random.default_rng(0)
            for i in range(args.samples):
                np.save(os.path.join(root, f"s{i:06d}.npy"), rng.standard_normal(floats, dtype=np.float32))
            for name in os.listdir(root):  # into the page cache, for both sides alike
                with open(os.path.join(root, name), "rb") as f:
                    while f.read(1 << 22):
                        pass
            total_gib = args.samples * floats * 4 / 2**30
            print(f"{args.samples} samples x {args.sample_kib} KiB = {total_gib:.2f} GiB; batch {args.batch}, "
                  f"{args.workers} workers, shuffle, persistent workers, collate {args.collate}; transport {args.transport}; "
                  f"{os.cpu_count()} CPUs; torch {torch.__version__}")

            client = dpuio.Client(addr, transports=args.transport)
            sides = {
                "posix": PosixDataset(root),
                "dpuio": dpuio.torch.Dataset("/bench", transform_fn=dpuio.torch.tensor_npy, client=client),
            }
            loaders = {
                name: torch.utils.data.DataLoader(
                    ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                    persistent_workers=args.workers > 0, generator=torch.Generator().manual_seed(1),
                    collate_fn=list if args.collate == "list" else None,
                )
                for name, ds in sides.items()
            }
            results = {name: [] for name in sides}
            print(f"{'epoch':>5} {'side':>5} {'samples/s':>10} {'GiB/s':>7} {'host CPU s/GiB':>15} "
                  f"{'agent CPU s/GiB':>16}")
            for epoch in range(args.epochs):
                for name in sides:
                    n, nbytes, wall, host, agent_cpu = run_epoch(loaders[name], args.compute_ms / 1000, agent.pid)
                    gib = nbytes / 2**30
                    r = dict(sps=n / wall, gibs=gib / wall, host=host / gib, agent=agent_cpu / gib)
                    results[name].append(r)
                    print(f"{epoch:>5} {name:>5} {r['sps']:>10.1f} {r['gibs']:>7.2f} {r['host']:>15.3f} "
                          f"{r['agent']:>16.3f}")
            for loader in loaders.values():
                if getattr(loader, "_iterator", None) is not None:
                    loader._iterator._shutdown_workers()

            def median(name, key):
                xs = [r[key] for r in results[name][1:]] or [r[key] for r in results[name]]
                return statistics.median(xs)

            print("\nmedian over epochs after the first:")
            for name in sides:
                print(f"  {name}: {median(name, 'sps'):8.1f} samples/s, {median(name, 'gibs'):5.2f} GiB/s, "
                      f"host CPU {median(name, 'host'):.3f} s/GiB, agent CPU {median(name, 'agent'):.3f} s/GiB")
            print(f"  dpuio/posix: samples/s x{median('dpuio', 'sps') / median('posix', 'sps'):.2f}, "
                  f"host CPU per GiB x{median('dpuio', 'host') / median('posix', 'host'):.2f} "
                  f"(target: >= 1.00 and <= 0.25)")
            client.close()
        finally:
            agent.terminate()
            agent.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
