"""Datasets, sharding and checkpoints with numpy only (dpuio.data)."""

import gc
import io
import itertools

import numpy as np
import pytest

import dpuio
from dpuio.data import Checkpoint, IterableCore, MapDataset, shard_indices


def test_map_dataset_lists_the_tree_and_reads_batches(client, tree):
    base, samples = tree
    ds = MapDataset(base, dpuio.npy, client=client)
    assert [p for p, _ in ds.objects] == sorted(samples)
    assert len(ds) == len(samples)
    paths = [p for p, _ in ds.objects]
    got = ds.__getitems__([5, 0, 22, 5])
    for i, a in zip([5, 0, 22, 5], got):
        np.testing.assert_array_equal(a, samples[paths[i]])
    del got, a  # no view of the first batch is left: its slab is reused
    np.testing.assert_array_equal(ds[3], samples[paths[3]])
    stats = ds.reader.stats
    # One open per distinct file, all four samples of the batch in one submission.
    assert stats["opens"] == 4 and stats["batches"] == 2 and stats["slabs"] == 1


def test_samples_are_zero_copy_views_that_stay_valid(client, tree):
    base, samples = tree
    paths = sorted(samples)
    ds = MapDataset(base, dpuio.npy, client=client, max_slabs=2, slab_bytes=1 << 16)
    kept = [ds.__getitems__(range(i, i + 4)) for i in range(0, 20, 4)]  # keep every batch
    stats = ds.reader.stats
    assert stats["slabs"] == 2 and stats["overflow_regions"] == 3
    for b, batch in enumerate(kept):
        for k, a in enumerate(batch):
            assert not a.flags.owndata  # a view of registered memory, not a copy
            np.testing.assert_array_equal(a, samples[paths[b * 4 + k]])
    del kept, batch, a
    gc.collect()
    before = ds.reader.stats["overflow_regions"]
    for i in range(0, 20, 4):  # views dropped: the two slabs are reused
        ds.__getitems__(range(i, i + 4))
    assert ds.reader.stats["overflow_regions"] == before and ds.reader.stats["slabs"] == 2


def test_handle_cache_is_bounded(client, tree):
    base, samples = tree
    ds = MapDataset(base, client=client, max_open_files=3)
    for i in range(len(ds)):
        assert bytes(ds[i]) == (ds.client.read_bytes(ds.objects[i][0]))
    assert len(ds.reader._files) == 3
    assert ds.reader.stats["opens"] == len(ds)


def test_missing_path_and_bad_index(client, tree):
    with pytest.raises(dpuio.NotFound, match="/t/does-not-exist"):
        MapDataset("/t/does-not-exist", client=client)
    ds = MapDataset(tree[0], client=client)
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_a_transform_that_raises_gives_transform_error(client, tree):
    def broken(buf):
        raise ValueError("cannot decode")

    ds = MapDataset(tree[0], broken, client=client)
    with pytest.raises(dpuio.TransformError, match=r"transform_fn failed on /t/\S+/s\d{3}\.npy: ValueError: cannot decode") as e:
        ds[1]
    assert isinstance(e.value.__cause__, ValueError)
    # The dataset keeps working afterwards.
    ds.transform_fn = dpuio.npy
    assert ds[1].dtype == np.float32


def test_files_vanishing_after_listing_are_not_found(agent, client, tree):
    base, samples = tree
    ds = MapDataset(base, client=client)
    victim = ds.objects[7][0]
    agent.remove(victim)
    with pytest.raises(dpuio.NotFound, match=victim):
        ds.__getitems__([6, 7, 8])
    assert len(ds.__getitems__([6, 8])) == 2


def test_empty_files(agent, client):
    agent.put("/empty/a", b"")
    agent.put("/empty/b", b"xy")
    ds = MapDataset("/empty", bytes, client=client)
    assert ds.__getitems__([0, 1]) == [b"", b"xy"]


@pytest.mark.parametrize("n,world,workers,drop_last", [(23, 1, 1, False), (23, 4, 3, False), (23, 4, 2, True),
                                                       (5, 8, 2, False), (100, 3, 4, False)])
def test_shards_cover_everything_evenly(n, world, workers, drop_last):
    for epoch in range(3):
        per_rank = []
        for rank in range(world):
            parts = [shard_indices(n, epoch=epoch, seed=7, shuffle=True, rank=rank, world_size=world, worker=w,
                                   num_workers=workers, drop_last=drop_last) for w in range(workers)]
            for a, b in itertools.combinations(parts, 2):
                assert not set(a) & set(b)  # workers of a rank never overlap
            per_rank.append(sorted(i for p in parts for i in p))
        assert len({len(r) for r in per_rank}) == 1  # every rank gets equally many
        union = {i for r in per_rank for i in r}
        if drop_last:
            assert len(union) == n - n % world
        else:
            assert union == set(range(n))


def test_shuffle_is_seeded_per_epoch():
    a0 = shard_indices(50, epoch=0, seed=1, shuffle=True)
    assert a0 == shard_indices(50, epoch=0, seed=1, shuffle=True)
    assert a0 != shard_indices(50, epoch=1, seed=1, shuffle=True)
    assert sorted(a0) == list(range(50))
    assert shard_indices(50) == list(range(50))
    with pytest.raises(dpuio.InvalidArgument):
        shard_indices(10, rank=2, world_size=2)


def test_iterable_core_with_explicit_rank(client, tree):
    base, samples = tree
    seen = []
    for rank in range(2):
        ds = IterableCore(base, bytes, client=client, batch_size=4, shuffle=True, seed=3)
        ds.set_epoch(5)
        seen.append([s for s in ds.iterate(rank, 2, 0, 1)])
    assert len(seen[0]) == len(seen[1]) == 12  # 23 padded to 24
    everything = {client.read_bytes(p) for p in samples}
    assert {*seen[0], *seen[1]} == everything


def test_checkpoint_round_trip_with_seeks(client):
    ck = Checkpoint("/ckpt/np", client=client, chunk_bytes=1 << 16, chunks_in_flight=3)
    data = np.random.default_rng(1).integers(0, 255, (1 << 20) + 12345, dtype=np.uint8).tobytes()
    with ck.writer("state.bin") as w:
        for i in range(0, len(data), 10007):  # odd-sized writes across chunk borders
            w.write(data[i : i + 10007])
        assert w.tell() == len(data)
        assert len(w._in_flight) <= 3  # bounded
    assert ck.names() == ["state.bin"] and "state.bin" in ck
    with ck.reader("state.bin") as r:
        assert r.read() == data
        r.seek(-100, io.SEEK_END)
        assert r.read(1000) == data[-100:]
        r.seek(70000)
        assert r.read(5) == data[70000:70005]
        assert r.chunks_read >= len(data) // (1 << 16)


def test_checkpoint_is_published_only_when_complete(client):
    ck = Checkpoint("/ckpt/atomic", client=client, chunk_bytes=1 << 16)
    with ck.writer("m") as w:
        w.write(b"old" * 1000)
    with pytest.raises(RuntimeError):
        with ck.writer("m") as w:
            w.write(b"new" * 100000)
            assert ck.names() == ["m"]  # the partial file is hidden
            raise RuntimeError("training crashed")
    assert ck.names() == ["m"]
    with ck.reader("m") as r:
        assert r.read() == b"old" * 1000  # the aborted write left nothing behind
    assert client.listdir("/ckpt/atomic") == ["m"]
    with ck.writer("m") as w:  # replacing a published checkpoint
        w.write(b"new")
    with ck.reader("m") as r:
        assert r.read() == b"new"
    with pytest.raises(dpuio.InvalidArgument):
        ck.writer("../escape")
    with pytest.raises(dpuio.NotFound):
        ck.reader("never-written")


def test_a_closed_client_stops_datasets_and_checkpoints_with_closed(agent, tree):
    base, samples = tree
    c = dpuio.Client(agent.addr)
    ds = MapDataset(base, dpuio.npy, client=c)
    kept = ds[0]
    ck = Checkpoint("/ckpt/closed", client=c, chunk_bytes=1 << 16)
    w = ck.writer("m")
    w.write(b"x" * 100)
    c.close()
    with pytest.raises(dpuio.Closed):
        ds[1]
    with pytest.raises(dpuio.Closed):
        MapDataset(base, client=c)
    with pytest.raises(dpuio.Closed):
        ck.writer("n")
    with pytest.raises(dpuio.Closed):
        w.close()  # nothing can be published
    assert w.closed
    with pytest.raises(dpuio.Closed):
        ck.reader("m")
    # What the dataset returned before stays valid: the memory lives with its views.
    np.testing.assert_array_equal(kept, samples[sorted(samples)[0]])
    ds.close()
