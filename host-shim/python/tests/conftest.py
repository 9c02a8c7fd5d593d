"""Fixtures: a real dpu-agent on a free loopback port, in a fresh data directory.

The agent binary comes from ``$DPUIO_BIN_DIR`` (default: the workspace's
``target/debug``; ``cargo build --workspace --bins`` builds it).

Every test gets a ``HOME`` and a ``DPUIO_CONFIG_DIR`` of its own (fresh temporary
directories), in ``os.environ`` for the clients it makes (and the processes they fork or
spawn) and in the environment of the agent it starts, and none of the user's ``DPUIO_*``
client settings: an agent writes its development client bundle there and clients find it
there, so tests never share one, nor read or overwrite the user's ``~/.config/dpuio``.
A test starts at most one agent (they would write their bundles to the same place).

With ``DPUIO_TEST_BACKEND=daos`` (and ``DAOS_POOL``, ``daos`` on ``PATH``: what
``daos-up.sh``'s env file sets) every agent runs ``[backend] kind = "daos"`` with a
container of its own, created on first use and destroyed when the agent stops; files are
planted and checked with DAOS's own ``daos filesystem copy``.
"""

import io
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN_DIR = Path(os.environ.get("DPUIO_BIN_DIR", ROOT / "target" / "debug"))
#: Seconds an agent may take to say where it listens: one stuck at its start fails the
#: test instead of hanging the suite.
START_DEADLINE = 180


class Agent:
    def __init__(self, data_dir, config_dir, config=None, listen="127.0.0.1:0"):
        binary = BIN_DIR / "dpu-agent"
        if not binary.is_file():
            pytest.fail(f"{binary} is missing: build it with `cargo build --workspace --bins`", pytrace=False)
        self.data_dir = Path(data_dir)
        #: The agent's ``DPUIO_CONFIG_DIR`` (clients of this agent use the same).
        self.config_dir = Path(config_dir)
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self._config = config
        args = [str(binary), "serve", "--data-dir", str(self.data_dir), "--listen", listen]
        #: With DPUIO_TEST_BACKEND=daos: (pool, container label).
        self.daos = None
        if os.environ.get("DPUIO_TEST_BACKEND") == "daos":
            pool = os.environ.get("DAOS_POOL") or pytest.fail("DPUIO_TEST_BACKEND=daos needs DAOS_POOL", pytrace=False)
            self.daos = (pool, f"py-{os.getpid()}-{time.time_ns() % 10**12}")
            config = (config or "") + (
                f'[backend]\nkind = "daos"\npool = "{pool}"\ncreate_containers = true\n'
                f'[[tenants]]\nname = "default"\ncontainer = "{self.daos[1]}"\n'
            )
        if config is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            (self.data_dir.parent / "agent.toml").write_text(config)
            args += ["--config", str(self.data_dir.parent / "agent.toml")]
        env = {**os.environ, "DPUIO_CONFIG_DIR": str(self.config_dir), "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        log = os.environ.get("DPUIO_AGENT_LOG")
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=open(log, "a") if log else None,
            text=True,
            env=env,
        )
        ready, _, _ = select.select([self.proc.stdout], [], [], START_DEADLINE)
        if not ready:
            self.proc.kill()
            pytest.fail(f"dpu-agent printed nothing within {START_DEADLINE} s of its start", pytrace=False)
        line = self.proc.stdout.readline()
        m = re.match(r"dpu-agent listening on (\S+)", line)
        if not m:
            self.proc.kill()
            pytest.fail(f"unexpected first line from dpu-agent: {line!r}", pytrace=False)
        self.addr = m.group(1)
        # The rest of the agent's standard output (UCX writes its warnings there) is
        # read on, into the test's captured output: left in the pipe, 64 KiB of it would
        # block the agent in a write, holding whatever lock it held then.
        threading.Thread(target=_forward, args=(self.proc.stdout,), daemon=True).start()
        #: The tenant's container as a local directory (to plant and check files).
        self.container = self.data_dir / "containers" / "default"

    def _daos_url(self, path):
        return f"daos://{self.daos[0]}/{self.daos[1]}/{path.lstrip('/')}"

    def _cli(self, *args):
        env = {**os.environ, "DPUIO_AGENT": self.addr, "DPUIO_CONFIG_DIR": str(self.config_dir)}
        subprocess.run([str(BIN_DIR / "dpuio"), *args], env=env, check=True, capture_output=True)

    def put(self, path, data):
        """Create a file in the container behind the agent's back."""
        if self.daos is None:
            p = self.container / path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            return data
        parent = path.rstrip("/").rsplit("/", 1)[0]
        if parent:
            self._cli("mkdir", "-p", parent)
        staged = self.data_dir / f"seed-{time.time_ns()}"
        staged.write_bytes(data)
        subprocess.run(["daos", "filesystem", "copy", "--src", str(staged), "--dst", self._daos_url(path)], check=True, capture_output=True)
        staged.unlink()
        return data

    def read(self, path):
        """The bytes of a file as the storage holds it (not through the agent)."""
        if self.daos is None:
            return (self.container / path.lstrip("/")).read_bytes()
        out = self.data_dir / f"out-{time.time_ns()}"
        subprocess.run(["daos", "filesystem", "copy", "--src", self._daos_url(path), "--dst", str(out)], check=True, capture_output=True)
        data = out.read_bytes()
        out.unlink()
        return data

    def remove(self, path):
        """Remove a file behind the client's back (over DAOS: through the agent's CLI,
        as DAOS's own tool has no remove)."""
        if self.daos is None:
            (self.container / path.lstrip("/")).unlink()
        else:
            self._cli("rm", path)

    def restart(self):
        """Kill the agent with SIGKILL and start another on the same address and data
        directory (what a crash and its supervisor's restart look like to clients)."""
        self.proc.kill()
        self.proc.wait(timeout=20)
        if self.daos is not None:
            pytest.skip("restarting an agent over DAOS is not covered here (the fixture makes a container per agent)")
        again = Agent(self.data_dir, self.config_dir, config=self._config, listen=self.addr)
        self.proc = again.proc

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self.daos is not None:
            subprocess.run(["daos", "container", "destroy", "--force", *self.daos], capture_output=True)


def _forward(stream):
    """Copy an agent's standard output to this process's standard error, line by line."""
    for line in stream:
        sys.stderr.write(f"dpu-agent: {line}")


#: The variables through which a user's shell could steer a client: tests never inherit them.
USER_SETTINGS = ("DPUIO_AGENT", "DPUIO_CERT", "DPUIO_KEY", "DPUIO_CA", "DPUIO_TOKEN", "DPUIO_TENANT", "DPUIO_TRANSPORT", "DPUIO_INTERFACE")


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    """This test's ``DPUIO_CONFIG_DIR`` (inside a scratch ``HOME``), set for the test's
    clients with the user's ``DPUIO_*`` settings removed (all restored after)."""
    home = tmp_path / "home"
    d = home / ".config" / "dpuio"
    d.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DPUIO_CONFIG_DIR", str(d))
    for name in USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    return d


@pytest.fixture
def agent(tmp_path, config_dir, monkeypatch):
    """An agent of this test's own, also in ``$DPUIO_AGENT``."""
    a = Agent(tmp_path / "data", config_dir)
    monkeypatch.setenv("DPUIO_AGENT", a.addr)
    try:
        yield a
    finally:
        a.stop()


@pytest.fixture
def small_io_agent(tmp_path, config_dir):
    """An agent that takes requests of at most 1 MiB (so splitting is cheap to test)."""
    a = Agent(tmp_path / "data", config_dir, config="[limits]\nmax_io_bytes = 1048576\n")
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

