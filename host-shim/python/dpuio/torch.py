"""PyTorch datasets and checkpoints over a dpuio container.

The counterpart of ``pydaos.torch``, with what it lacks:

* :class:`Dataset` (map-style) lists the tree with batched readdir, and its
  ``__getitems__`` (used by ``DataLoader`` for a whole batch) opens the batch's files
  together and asks the agent for all of them in one ring submission, instead of one
  synchronous open and read per sample. Samples reach ``transform_fn`` as views of
  registered memory the agent filled, not copies.
* :class:`IterableDataset` shards by ``torch.distributed`` rank (or explicit
  ``rank``/``world_size``) and by DataLoader worker, and shuffles per epoch with a seed.
* :class:`Checkpoint` writes with a bounded number of chunks in flight and publishes
  a checkpoint only once it is complete.
* DataLoader workers (fork or spawn) attach by themselves: no ``worker_init_fn``.

Example::

    ds = dpuio.torch.Dataset("/datasets/train", transform_fn=dpuio.npy)
    loader = torch.utils.data.DataLoader(ds, batch_size=32, num_workers=4, shuffle=True)
"""

import torch
import torch.utils.data

from . import npy  # noqa: F401 (a handy transform_fn: a zero-copy array over .npy bytes)
from .data import Checkpoint, CheckpointReader, CheckpointWriter, IterableCore, MapDataset, shard_indices

__all__ = ["Dataset", "IterableDataset", "Checkpoint", "CheckpointReader", "CheckpointWriter", "shard_indices",
           "tensor", "tensor_npy", "npy"]


class Dataset(MapDataset, torch.utils.data.Dataset):
    """Map-style dataset of every file under ``path`` in the container.

    Args:
        path: directory in the container (listed recursively, sorted).
        transform_fn: called with each sample's bytes (a ``memoryview`` over
            registered memory); default: return the view itself. ``dpuio.npy`` turns
            ``.npy`` bytes into an array without copying; :func:`tensor` into a uint8
            tensor. An exception in it is raised as :class:`dpuio.TransformError`.
        client: a :class:`dpuio.Client` (default: a new one for ``agent``).
        agent: agent address (default ``$DPUIO_AGENT``).
        filter_fn: keep only paths for which it returns true.
        max_open_files: file handles kept open per process across epochs.
        slab_bytes, max_slabs: registered memory a process reads batches into.
    """


class IterableDataset(IterableCore, torch.utils.data.IterableDataset):
    """Iterable dataset of every file under ``path``, sharded and shuffled.

    Each rank of a distributed job reads a disjoint, equally long share of the samples
    (``torch.distributed`` rank and world size if it is initialised, else ``rank`` and
    ``world_size`` given here, else all of them); each DataLoader worker reads a
    disjoint part of its rank's share. With ``shuffle``, the order is a permutation
    seeded by ``seed + epoch`` (the same on every rank); call :meth:`set_epoch` before
    each epoch. Samples are read ``batch_size`` at a time (one submission).

    Takes the arguments of :class:`Dataset`, and ``batch_size``, ``shuffle``, ``seed``,
    ``rank``, ``world_size``, ``drop_last``.
    """

    def _rank(self):
        if self.rank is not None or self.world_size is not None:
            return int(self.rank or 0), int(self.world_size or 1)
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def __iter__(self):
        rank, world_size = self._rank()
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.iterate(rank, world_size, worker, num_workers)


def tensor(buf):
    """A transform_fn: the sample's bytes as a uint8 tensor (a view, no copy)."""
    return torch.frombuffer(buf, dtype=torch.uint8) if len(buf) else torch.empty(0, dtype=torch.uint8)


def tensor_npy(buf):
    """A transform_fn: a ``.npy`` sample as a tensor over the bytes the agent put in
    registered memory (no copy; see :func:`dpuio.npy`)."""
    return torch.from_numpy(npy(buf))
