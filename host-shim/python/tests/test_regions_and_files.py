"""The region cache behind the convenience calls, RegionFile (np.load of .npy and
.npz), the transport a client runs on, and sessions of killed processes."""

import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import dpuio
from conftest import BIN_DIR


def test_read_bytes_reuses_registered_regions(agent, client):
    for i in range(5):
        agent.put(f"/rc/{i}", bytes([i]) * (1000 + i))
    for _ in range(3):
        for i in range(5):
            assert client.read_bytes(f"/rc/{i}") == bytes([i]) * (1000 + i)
    stats = client.region_cache
    assert stats["registered"] == 1 and stats["hits"] == 14, stats
    assert client.write_bytes("/rc/w", b"abc" * 100) == 300
    assert client.read_bytes("/rc/w") == b"abc" * 100
    assert client.region_cache["registered"] == 1
    agent.put("/rc/empty", b"")
    assert client.read_bytes("/rc/empty") == b""


def test_region_cache_is_bounded_and_thread_safe(agent):
    c = dpuio.Client(agent.addr, region_cache_bytes=1 << 20)
    try:
        agent.put("/rb/big", os.urandom(3 << 20))  # larger than the cache: per call
        assert c.read_bytes("/rb/big") == agent.read("/rb/big")
        assert c.region_cache["uncached"] == 1 and c.region_cache["free_bytes"] == 0
        blobs = {f"/rb/{i}": os.urandom(100_000 + i) for i in range(8)}
        for p, d in blobs.items():
            agent.put(p, d)
        errors = []

        def worker():
            try:
                for _ in range(20):
                    for p, d in blobs.items():
                        assert c.read_bytes(p) == d
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        stats = c.region_cache
        assert stats["free_bytes"] <= 1 << 20
        assert stats["registered"] <= 8, stats  # not one per call
    finally:
        c.close()


def test_a_kept_view_is_never_overwritten_by_a_reuse(agent, client):
    agent.put("/rk/a", b"a" * 5000)
    agent.put("/rk/b", b"b" * 5000)
    f = client.read_file("/rk/a")
    kept = f.getbuffer()
    f.close()  # the view lives on: this region must not be reused
    assert client.read_bytes("/rk/b") == b"b" * 5000
    assert bytes(kept) == b"a" * 5000


def test_np_load_npy_and_npz_from_a_region_file(agent, client):
    a = np.arange(1000, dtype=np.float64).reshape(10, 100)
    b = np.array([[1, 2], [3, 4]], dtype=np.int16)
    npz = io.BytesIO()
    np.savez(npz, a=a, b=b)
    agent.put("/np/x.npz", npz.getvalue())
    npc = io.BytesIO()
    np.savez_compressed(npc, a=a)
    agent.put("/np/c.npz", npc.getvalue())
    npy = io.BytesIO()
    np.save(npy, a)
    agent.put("/np/x.npy", npy.getvalue())

    with client.read_file("/np/x.npz") as f, np.load(f) as z:
        assert sorted(z.files) == ["a", "b"]
        np.testing.assert_array_equal(z["a"], a)
        np.testing.assert_array_equal(z["b"], b)
    with client.read_file("/np/c.npz") as f, np.load(f) as z:
        np.testing.assert_array_equal(z["a"], a)
    with client.read_file("/np/x.npy") as f:
        np.testing.assert_array_equal(np.load(f), a)
        view = dpuio.npy(f.getbuffer())  # no copy
        np.testing.assert_array_equal(view, a)
        del view


def test_region_file_is_a_seekable_raw_file():
    f = dpuio.RegionFile(bytearray(b"0123456789"), size=8)
    assert isinstance(f, io.RawIOBase) and f.seekable() and f.readable()
    assert f.read(3) == b"012" and f.tell() == 3
    assert f.seek(-2, io.SEEK_END) == 6 and f.read() == b"67"
    assert f.read(5) == b""
    f.seek(1)
    buf = bytearray(4)
    assert f.readinto(buf) == 4 and buf == b"1234"
    f.seek(20)
    assert f.readinto(buf) == 0
    r = io.BufferedReader(dpuio.RegionFile(b"abc\ndef\n"))
    assert r.readlines() == [b"abc\n", b"def\n"]
    f.close()
    with pytest.raises(ValueError):
        f.read()
    with pytest.raises(dpuio.InvalidArgument):
        dpuio.RegionFile(b"ab", size=3)


def test_transport_says_what_auto_chose(agent, client):
    t = client.transport
    assert isinstance(t, dpuio.TransportInfo)
    assert t.name in ("ucx", "ofi-shm", "ofi-tcp"), t
    assert t.provider in ("ucx", "ofi") and "\n" not in t.detail


def _agent_sessions(agent):
    out = subprocess.run(
        [str(BIN_DIR / "dpuctl"), "--data-dir", str(agent.data_dir), "status"],
        capture_output=True, text=True, check=True,
    ).stdout
    return out


def _session_count(agent):
    out = _agent_sessions(agent)
    for line in out.splitlines():
        words = line.replace(":", " ").split()
        if words and words[0] == "sessions":
            return int(words[1])
    raise AssertionError(f"no session count in dpuctl status:\n{out}")


CHILD = textwrap.dedent("""
    import sys, time, dpuio
    c = dpuio.Client(sys.argv[1])
    c.write_bytes("/killed-" + sys.argv[2], b"x" * 4096)
    r = c.region(1 << 20)
    print("attached", flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_sessions_of_a_killed_process_end_within_seconds(agent, sig):
    before = _session_count(agent)
    child = subprocess.Popen([sys.executable, "-c", CHILD, agent.addr, sig.name], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "attached"
        assert _session_count(agent) == before + 2  # control and data
        t0 = time.monotonic()
        child.send_signal(sig)
        assert child.wait(timeout=10) == -sig
        while _session_count(agent) > before:
            assert time.monotonic() - t0 < 5, f"sessions still held after {sig.name}:\n{_agent_sessions(agent)}"
            time.sleep(0.1)
    finally:
        child.kill()
        child.wait()
