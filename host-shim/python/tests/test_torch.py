"""PyTorch integration: DataLoader (workers 0 and 2, fork and spawn), IterableDataset
sharding, torch.save/torch.load through Checkpoint, torch.frombuffer over a region.

Each test is reported as skipped, with the reason, when torch cannot be imported
(ci.sh says why it is missing).
"""

import collections
import os

import numpy as np
import pytest

import dpuio

try:
    import torch

    import dpuio.torch as dt
except ImportError as e:  # every test below is reported as skipped, with the reason
    torch = dt = None
    _REASON = os.environ.get("DPUIO_TORCH_SKIP_REASON") or (
        f"torch cannot be imported here ({e}); host-shim/python/ci.sh installs it"
    )

if torch is None:
    pytestmark = pytest.mark.skip(reason=_REASON)

#: Seconds a DataLoader waits for a worker's batch before it raises: a worker stuck
#: (a lock its parent held at fork time) fails the test instead of hanging the suite.
WORKER_TIMEOUT = 600


def test_frombuffer_tensor_sees_the_agents_bytes(agent, client):
    data = agent.put("/tt/raw.bin", np.arange(1 << 18, dtype=np.int32).tobytes())
    with client.open("/tt/raw.bin") as f:
        r = client.region(len(data), "w")
        t = torch.frombuffer(r, dtype=torch.int32)
        assert f.read_into(r) == len(data)
    assert torch.equal(t, torch.arange(1 << 18, dtype=torch.int32))
    r.free()
    # The tensor keeps the region object, and so its memory, alive after free().
    assert int(t[12345]) == 12345
    with pytest.raises(dpuio.Closed):
        memoryview(r)
    with pytest.raises(RuntimeError):  # torch turns the buffer error into its own
        torch.frombuffer(r, dtype=torch.uint8)


def _check_epoch(loader, samples):
    seen = collections.Counter()
    for batch in loader:
        for a in batch:
            key = float(a.reshape(-1)[0]), a.shape
            seen[key] += 1
    want = collections.Counter((float(a.reshape(-1)[0]), torch.Size(a.shape)) for a in samples.values())
    assert seen == want


@pytest.mark.parametrize("workers,context", [(0, None), (2, "fork"), (2, "spawn")])
def test_dataloader_map_style(client, tree, workers, context):
    base, samples = tree
    ds = dt.Dataset(base, transform_fn=dt.tensor_npy, client=client)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, shuffle=True, num_workers=workers, collate_fn=list,
        multiprocessing_context=context, persistent_workers=False, timeout=WORKER_TIMEOUT if workers else 0,
    )
    _check_epoch(loader, samples)


def test_dataloader_iterable_two_workers_two_epochs(client, tree):
    base, samples = tree
    ds = dt.IterableDataset(base, transform_fn=dt.tensor_npy, client=client, batch_size=3, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, timeout=WORKER_TIMEOUT)
    orders = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        got = [float(a.reshape(-1)[0]) for a in loader]
        assert sorted(got) == sorted(float(a.reshape(-1)[0]) for a in samples.values())
        orders.append(got)
    assert orders[0] != orders[1]


def test_iterable_rank_sharding(client, tree):
    base, samples = tree
    shares = []
    for rank in range(3):
        ds = dt.IterableDataset(base, transform_fn=dt.tensor_npy, client=client, rank=rank, world_size=3)
        shares.append({float(a.reshape(-1)[0]) for a in ds})
    assert all(len(s) == 8 for s in shares)  # 23 padded to 24
    assert set().union(*shares) == {float(a.reshape(-1)[0]) for a in samples.values()}


def test_transform_error_reaches_the_main_process(client, tree, monkeypatch):
    # After a worker raised, torch waits this long per worker before it terminates
    # them (5 s by default; the same with any dataset).
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.2)
    ds = dt.Dataset(tree[0], transform_fn=_broken, client=client)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, timeout=WORKER_TIMEOUT))
    with pytest.raises(dpuio.TransformError, match="transform_fn failed on"):
        next(it)
    # Stop the workers now: a forked worker still alive holds copies of this
    # process's connections to the agent, which would keep them open.
    it._shutdown_workers()


def _broken(buf):
    raise ValueError("bad sample")


def test_torch_save_and_load_through_checkpoint(client):
    ck = dt.Checkpoint("/tt/ckpt", client=client, chunk_bytes=1 << 20, chunks_in_flight=3)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    state = {"model": model.state_dict(), "step": 7, "big": torch.randn(1 << 20)}
    with ck.writer("step-7.pt") as w:
        torch.save(state, w)
    with ck.reader("step-7.pt") as r:
        back = torch.load(r)
    assert back["step"] == 7
    for k, v in state["model"].items():
        assert torch.equal(back["model"][k], v)
    assert torch.equal(back["big"], state["big"])
    assert ck.names() == ["step-7.pt"]


def test_datasets_pickle_for_spawned_workers(client, tree):
    import pickle

    ds = dt.Dataset(tree[0], transform_fn=dt.tensor_npy, client=client)
    ds[0]  # a reader exists in this process
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.objects == ds.objects
    assert torch.equal(clone[0], ds[0])
    assert os.getpid() == clone.client._pid
