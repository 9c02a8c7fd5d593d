"""Training loops ride out an agent restart: a DataLoader over ``dpuio.torch.Dataset``
(and a plain read loop without torch) keeps running through ``kill -9`` of the agent
and its restart on the same address, with no exception and a stall of at most 5 s.
"""

import threading
import time

import numpy as np
import pytest

import dpuio

#: The issue's bound on the stall a restart may cause.
MAX_STALL_S = 5.0


def _run_through_restart(agent, step):
    """Call ``step()`` in a loop on a thread; kill -9 and restart the agent after 1 s,
    stop 2 s after it is back. Returns (steps, longest step in seconds)."""
    stop = threading.Event()
    errors, gaps = [], []

    def loop():
        try:
            while not stop.is_set():
                t = time.monotonic()
                step()
                gaps.append(time.monotonic() - t)
        except BaseException as e:  # reported by the test, not swallowed
            errors.append(e)

    t = threading.Thread(target=loop)
    t.start()
    time.sleep(1.0)
    before = len(gaps)
    agent.restart()
    time.sleep(2.0)
    stop.set()
    t.join(timeout=60)
    assert not errors, f"the loop failed: {errors[0]!r}"
    assert len(gaps) > before, "no step completed after the restart"
    return len(gaps), max(gaps)


def test_a_read_loop_keeps_going_through_kill_9(agent):
    data = agent.put("/r/blob.bin", bytes(range(256)) * 4096)
    c = dpuio.Client(agent.addr, resume=30)
    sessions = set()

    def step():
        assert c.read_bytes("/r/blob.bin") == data
        sessions.add(c._dp().session_id)

    steps, longest = _run_through_restart(agent, step)
    print(f"read loop: {steps} reads, longest {longest:.3f} s")
    assert longest <= MAX_STALL_S
    assert len(sessions) >= 2, "the client attached again"
    c.close()


def test_with_resume_off_a_restart_is_an_error(agent):
    agent.put("/r/x", b"x" * 100)
    c = dpuio.Client(agent.addr, resume=0)
    assert c.read_bytes("/r/x") == b"x" * 100
    agent.restart()
    with pytest.raises(dpuio.Error):
        c.read_bytes("/r/x")
    c.close()


def test_dataloader_keeps_going_through_kill_9(agent, tree):
    torch = pytest.importorskip("torch", reason="torch cannot be imported here; host-shim/python/ci.sh installs it")
    import dpuio.torch as dt

    base, samples = tree
    c = dpuio.Client(agent.addr, resume=30)
    ds = dt.Dataset(base, transform_fn=dt.tensor_npy, client=c)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=0, collate_fn=list)
    want = sorted(float(a.reshape(-1)[0]) for a in samples.values())

    def step():
        got = sorted(float(a.reshape(-1)[0]) for batch in loader for a in batch)
        assert got == want  # a whole epoch, every sample right

    epochs, longest = _run_through_restart(agent, step)
    print(f"DataLoader: {epochs} epochs of {len(want)} samples, longest {longest:.3f} s")
    assert longest <= MAX_STALL_S
    c.close()
