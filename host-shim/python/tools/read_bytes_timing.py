"""read_bytes with and without the region cache, in one run against one agent.

    DPUIO_BIN_DIR=target/debug python host-shim/python/tools/read_bytes_timing.py [MiB per file] [files] [rounds]

Starts an agent of its own (in a temporary directory), writes the files, then reads
them with a region registered per call (what read_bytes did before the cache) and with
read_bytes (the cache), reporting MiB/s and the agent's CPU seconds (from
/proc/<pid>/stat) per phase, and their ratios.
"""

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import Agent  # noqa: E402

import dpuio  # noqa: E402


def agent_cpu_s(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_call(c, path):
    with c.open(path) as f, c.region(f.size, "w") as r:
        n = f.read_into(r)
        return bytes(memoryview(r)[:n])


def phase(name, c, pid, paths, rounds, read):
    cpu0, t0, total = agent_cpu_s(pid), time.perf_counter(), 0
    for _ in range(rounds):
        for p in paths:
            total += len(read(c, p))
    secs, cpu = time.perf_counter() - t0, agent_cpu_s(pid) - cpu0
    mib_s = total / secs / (1 << 20)
    print(f"{name:28s} {mib_s:9.1f} MiB/s   agent CPU {cpu:6.2f} s   ({total >> 20} MiB in {secs:.2f} s)")
    return mib_s, cpu


def main():
    mib, files, rounds = (int(a) for a in (sys.argv[1:] + ["4", "8", "8"][len(sys.argv) - 1:])[:3])
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DPUIO_CONFIG_DIR"] = f"{tmp}/config"
        agent = Agent(Path(tmp) / "data", Path(tmp) / "config")
        try:
            paths = [agent.put(f"/timing/{i}", os.urandom(mib << 20)) and f"/timing/{i}" for i in range(files)]
            with dpuio.Client(agent.addr) as c:
                print(f"transport {c.transport.name} ({c.transport.detail}); {files} files of {mib} MiB, {rounds} rounds")
                per_call(c, paths[0]), c.read_bytes(paths[0])  # warm both paths up
                old = phase("region per call (before)", c, agent.proc.pid, paths, rounds, per_call)
                new = phase("read_bytes, cached (after)", c, agent.proc.pid, paths, rounds, lambda c, p: c.read_bytes(p))
                print(f"ratio after/before: {new[0] / old[0]:.2f}x MiB/s, "
                      f"{new[1] / old[1] if old[1] else float('nan'):.2f}x agent CPU; cache {c.region_cache}")
        finally:
            agent.stop()


if __name__ == "__main__":
    main()
