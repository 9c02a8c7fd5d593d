"""Fixtures: a real dpu-agent on a free loopback port, in a fresh data directory.

The agent binary comes from ``$DPUIO_BIN_DIR`` (default: the workspace's
``target/debug``; ``cargo build --workspace --bins`` builds it).
"""

import io
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN_DIR = Path(os.environ.get("DPUIO_BIN_DIR", ROOT / "target" / "debug"))


class Agent:
    def __init__(self, data_dir, config=None):
        binary = BIN_DIR / "dpu-agent"
        if not binary.is_file():
            pytest.fail(f"{binary} is missing: build it with `cargo build --workspace --bins`", pytrace=False)
        self.data_dir = Path(data_dir)
        args = [str(binary), "serve", "--data-dir", str(self.data_dir), "--listen", "127.0.0.1:0"]
        if config is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            (self.data_dir.parent / "agent.toml").write_text(config)
            args += ["--config", str(self.data_dir.parent / "agent.toml")]
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=open(os.environ["DPUIO_AGENT_LOG"], "w") if os.environ.get("DPUIO_AGENT_LOG") else None,
            text=True,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
        )
        line = self.proc.stdout.readline()
        m = re.match(r"dpu-agent listening on (\S+)", line)
        if not m:
            self.proc.kill()
            pytest.fail(f"unexpected first line from dpu-agent: {line!r}", pytrace=False)
        self.addr = m.group(1)
        #: The tenant's container as a local directory (to plant and check files).
        self.container = self.data_dir / "containers" / "default"

    def put(self, path, data):
        """Create a file in the container behind the agent's back."""
        p = self.container / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return data

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def agent():
    with tempfile.TemporaryDirectory(prefix="dpuio-pytest-") as d:
        a = Agent(Path(d) / "data")
        os.environ["DPUIO_AGENT"] = a.addr
        try:
            yield a
        finally:
            a.stop()


@pytest.fixture
def small_io_agent(tmp_path):
    """An agent that takes requests of at most 1 MiB (so splitting is cheap to test)."""
    a = Agent(tmp_path / "data", config="[limits]\nmax_io_bytes = 1048576\n")
    try:
        yield a
    finally:
        a.stop()


@pytest.fixture
def client(agent):
    import dpuio

    c = dpuio.Client(agent.addr)
    yield c
    c.close()


@pytest.fixture
def tree(agent, request):
    """A directory of .npy samples: (container path, {path: array})."""
    import numpy as np

    base = f"/t/{request.node.name}"
    samples = {}
    for i in range(23):
        sub = "" if i % 3 else "sub/"
        a = np.arange(i, i + 257 * (1 + i % 4), dtype=np.float32).reshape(-1, 1 + i % 4) * (i + 1)
        b = io.BytesIO()
        np.save(b, a)
        path = f"{base}/{sub}s{i:03d}.npy"
        agent.put(path, b.getvalue())
        samples[path] = a
    return base, samples

