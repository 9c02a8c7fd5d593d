"""Datasets and checkpoints over a dpuio container, without PyTorch.

:mod:`dpuio.torch` puts PyTorch's base classes on these; everything that decides what
is read, from where, into which memory, and in what order lives here, so it can be
tested and used with numpy alone.

Reading samples (``SampleReader``): the files of a batch are opened together (the opens
are in flight at once, and the handles are kept for the next epochs, up to a limit),
then one ring submission asks the agent for every file of the batch; the agent puts
the bytes into a registered region ("slab") that is reused from batch to batch. A
sample reaches ``transform_fn`` as a ``memoryview`` over that memory: no copy on the
host. A slab is reused only once no view of it is left, so whatever ``transform_fn``
keeps (``dpuio.npy`` arrays, for instance) stays valid.
"""

import concurrent.futures
import gc
import io
import os
import random
import threading
from collections import OrderedDict, deque

from . import Client, _native, _seek_position
from ._errors import Closed, Error, InvalidArgument, TransformError

__all__ = [
    "SampleReader",
    "MapDataset",
    "IterableCore",
    "shard_indices",
    "Checkpoint",
    "CheckpointWriter",
    "CheckpointReader",
]

#: Sample start alignment inside a slab (so numpy views of typed data are aligned).
ALIGN = 64
#: Default slab size: one batch of samples lands in one slab if it fits.
SLAB_BYTES = 64 << 20
#: Slabs kept per process; beyond that a batch gets a region of its own.
MAX_SLABS = 4
#: Open files kept per process (the agent allows 4096 per session by default).
MAX_OPEN_FILES = 1024


def _identity(view):
    return view


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


class SampleReader:
    """Reads whole files into registered memory, a batch at a time, in one process.

    Not shared across processes: :class:`MapDataset` keeps one per process id.
    """

    def __init__(self, client, max_open_files=MAX_OPEN_FILES, slab_bytes=SLAB_BYTES, max_slabs=MAX_SLABS):
        self.client = client
        self.max_open_files = max(1, int(max_open_files))
        self.slab_bytes = int(slab_bytes)
        self.max_slabs = int(max_slabs)
        self._files = OrderedDict()  # path -> File, least recently used first
        self._slabs = []
        self._lock = threading.Lock()  # slabs
        self._files_lock = threading.Lock()
        self.stats = {"batches": 0, "samples": 0, "bytes": 0, "opens": 0, "slabs": 0, "overflow_regions": 0}

    def _open(self, paths):
        """Files for ``paths`` (cached handles, the rest opened together)."""
        missing = [p for p in dict.fromkeys(paths) if p not in self._files]
        if missing:
            for path, f in zip(missing, self.client.open_many(missing)):
                self._files[path] = f
            self.stats["opens"] += len(missing)
        files = []
        for p in paths:
            self._files.move_to_end(p)
            files.append(self._files[p])
        return files

    def _evict(self, keep):
        excess = len(self._files) - self.max_open_files
        if excess <= 0:
            return
        victims = []
        for path in list(self._files):
            if len(victims) == excess:
                break
            if path not in keep:
                victims.append(self._files.pop(path))
        self.client.close_many(victims)

    def _slab(self, nbytes):
        """A region of at least ``nbytes`` that no view refers to, and a view of it
        (taken under the lock, so no other thread can pick the same slab)."""
        with self._lock:
            for attempt in range(2):
                for slab in self._slabs:
                    if slab.exports == 0 and len(slab) >= nbytes:
                        return slab, memoryview(slab)
                if len(self._slabs) < self.max_slabs:
                    slab = self.client.region(max(nbytes, self.slab_bytes), "w")
                    self._slabs.append(slab)
                    self.stats["slabs"] += 1
                    return slab, memoryview(slab)
                if attempt == 0:
                    # Views kept alive only by reference cycles (a traceback, say).
                    gc.collect()
            # Every slab is still viewed by samples the caller kept: this batch gets a
            # region of its own, unmapped when its last view goes.
            self.stats["overflow_regions"] += 1
            slab = self.client.region(nbytes, "w")
            return slab, memoryview(slab)

    def read(self, items):
        """Read ``items`` (``(path, size)`` pairs; the size is a hint, the size at open
        wins) and return one ``memoryview`` per item, over registered memory."""
        paths = [p for p, _ in items]
        with self._files_lock:
            files = self._open(paths)
        sizes = [f.size for f in files]
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += _align(n)
        slab, whole = self._slab(max(total, 1))
        try:
            ops = [(False, f, slab, off, n, 0, False) for f, off, n in zip(files, offsets, sizes) if n > 0]
            results = iter(self.client.submit(ops)) if ops else iter(())
            views = [whole[off : off + (next(results) if n > 0 else 0)] for off, n in zip(offsets, sizes)]
        finally:
            del whole  # the slices keep the slab's view alive as long as they live
        with self._files_lock:
            self._evict(set(paths))
        self.stats["batches"] += 1
        self.stats["samples"] += len(items)
        self.stats["bytes"] += sum(len(v) for v in views)
        return views

    def close(self):
        files, self._files = list(self._files.values()), OrderedDict()
        try:
            self.client.close_many(files)
        except Error:
            pass  # the client is closed: the agent closed them with the session
        self._slabs = []


class _PerProcess:
    """One value per process id (a dataset's reader must not cross a fork)."""

    def __init__(self, make):
        self._make = make
        self._pid = None
        self._value = None

    def get(self):
        pid = os.getpid()
        if self._pid != pid:
            self._pid, self._value = pid, self._make()
        return self._value

    def peek(self):
        return self._value if self._pid == os.getpid() else None


def _apply(transform_fn, path, view):
    try:
        return transform_fn(view)
    except Exception as e:
        raise TransformError(f"transform_fn failed on {path}: {type(e).__name__}: {e}") from e


class MapDataset:
    """A map-style dataset of every file under ``path`` (see :class:`dpuio.torch.Dataset`)."""

    def __init__(
        self,
        path,
        transform_fn=None,
        *,
        client=None,
        agent=None,
        filter_fn=None,
        list_concurrency=8,
        max_open_files=MAX_OPEN_FILES,
        slab_bytes=SLAB_BYTES,
        max_slabs=MAX_SLABS,
    ):
        self.client = client if client is not None else Client(agent)
        self.path = path
        self.transform_fn = transform_fn if transform_fn is not None else _identity
        objects = self.client.list_files(path, list_concurrency)
        if filter_fn is not None:
            objects = [o for o in objects if filter_fn(o[0])]
        #: ``(path, size)`` of every sample, sorted by path.
        self.objects = objects
        self._reader_options = dict(max_open_files=max_open_files, slab_bytes=slab_bytes, max_slabs=max_slabs)
        self._reader = _PerProcess(self._new_reader)

    def _new_reader(self):
        return SampleReader(self.client, **self._reader_options)

    @property
    def reader(self):
        """This process's :class:`SampleReader`."""
        return self._reader.get()

    def __len__(self):
        return len(self.objects)

    def __getitem__(self, index):
        return self.__getitems__([index])[0]

    def __getitems__(self, indices):
        """A batch of samples read together: the files are opened together and the
        reads go to the agent in one submission."""
        items = [self.objects[i] for i in indices]
        views = self.reader.read(items)
        return [_apply(self.transform_fn, path, v) for (path, _), v in zip(items, views)]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_reader"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reader = _PerProcess(self._new_reader)

    def close(self):
        reader = self._reader.peek()
        if reader is not None:
            reader.close()


def shard_indices(n, *, epoch=0, seed=0, shuffle=False, rank=0, world_size=1, worker=0, num_workers=1,
                  drop_last=False):
    """The sample indices one DataLoader worker of one rank reads in one epoch.

    Every rank computes the same permutation (``seed + epoch``), makes its length a
    multiple of ``world_size`` (padding by wrapping around, or with ``drop_last``
    dropping the tail) so all ranks get equally many samples, takes every
    ``world_size``-th from ``rank``, then splits that between workers the same way.
    """
    if not 0 <= rank < world_size:
        raise InvalidArgument(f"rank {rank} is not in 0..{world_size - 1}")
    if not 0 <= worker < num_workers:
        raise InvalidArgument(f"worker {worker} is not in 0..{num_workers - 1}")
    order = list(range(n))
    if shuffle:
        random.Random(seed + epoch).shuffle(order)
    if drop_last:
        order = order[: n - n % world_size]
    elif n % world_size and n:
        pad = world_size - n % world_size
        order += (order * (pad // n + 1))[:pad]
    return order[rank::world_size][worker::num_workers]


class IterableCore(MapDataset):
    """The machinery of :class:`dpuio.torch.IterableDataset`: sharding, shuffling and
    batched reads; the rank and worker come from the caller."""

    def __init__(self, path, transform_fn=None, *, batch_size=32, shuffle=False, seed=0, rank=None,
                 world_size=None, drop_last=False, **kwargs):
        super().__init__(path, transform_fn, **kwargs)
        if batch_size < 1:
            raise InvalidArgument("batch_size must be at least 1")
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self._epoch = None
        self._iterations = 0

    def set_epoch(self, epoch):
        """Use ``epoch`` for the next iteration's shuffle (call it in the main process
        before each epoch, as with DistributedSampler; without it each iteration of
        this object counts as a new epoch)."""
        self._epoch = int(epoch)

    def _next_epoch(self):
        if self._epoch is not None:
            return self._epoch
        epoch = self._iterations
        self._iterations += 1
        return epoch

    def iterate(self, rank, world_size, worker, num_workers):
        epoch = self._next_epoch()
        indices = shard_indices(
            len(self.objects), epoch=epoch, seed=self.seed, shuffle=self.shuffle, rank=rank,
            world_size=world_size, worker=worker, num_workers=num_workers, drop_last=self.drop_last,
        )
        for start in range(0, len(indices), self.batch_size):
            yield from self.__getitems__(indices[start : start + self.batch_size])


# -- checkpoints ----------------------------------------------------------------

#: Checkpoint chunk size when the container's chunk size is smaller.
CHUNK_BYTES = 8 << 20
#: Chunks being written or read at once, per writer or reader.
CHUNKS_IN_FLIGHT = 4


class CheckpointWriter(io.RawIOBase):
    """A write-only file object that streams into a temporary file of the container
    and publishes it under its name on :meth:`close`. Use with ``with`` (an exception
    in the block discards the temporary file).

    Bytes are copied into one of ``chunks_in_flight`` registered chunks; a full chunk
    is handed to the agent while the next one fills. When all chunks are in flight,
    ``write`` waits for the oldest: memory and work in flight are bounded.
    """

    def __init__(self, client, path, chunk_bytes, chunks_in_flight):
        super().__init__()
        self.client = client
        self.path = path
        # A whole-file put's temporary name: published with the rights of a put.
        self.temp_path = _native.Session.put_temp_path(path)
        self.chunk_bytes = chunk_bytes
        self._file = client.open(self.temp_path, "x")
        self._free = deque(client.region(chunk_bytes, "r") for _ in range(chunks_in_flight))
        self._in_flight = deque()  # (future, region)
        self._pool = concurrent.futures.ThreadPoolExecutor(chunks_in_flight, thread_name_prefix="dpuio-ckpt")
        self._chunk = None
        self._view = None
        self._fill = 0
        self._offset = 0  # file offset of the current chunk
        self._published = False
        self._aborted = False

    def writable(self):
        return True

    def tell(self):
        return self._offset + self._fill

    def _take_chunk(self):
        if not self._free:
            future, region = self._in_flight.popleft()
            future.result()  # raises the write's error
            self._free.append(region)
        self._chunk = self._free.popleft()
        self._view = memoryview(self._chunk)
        self._fill = 0

    def _flush_chunk(self):
        if self._chunk is None or self._fill == 0:
            return
        chunk, n, at = self._chunk, self._fill, self._offset
        self._view.release()
        self._chunk = self._view = None
        self._in_flight.append((self._pool.submit(self._file.write_from, chunk, at, length=n), chunk))
        self._offset += n
        self._fill = 0

    def write(self, b):
        if self.closed:
            raise Closed(f"checkpoint writer for {self.path} is closed")
        data = memoryview(b).cast("B")
        done = 0
        while done < len(data):
            if self._chunk is None:
                self._take_chunk()
            n = min(len(data) - done, self.chunk_bytes - self._fill)
            self._view[self._fill : self._fill + n] = data[done : done + n]
            self._fill += n
            done += n
            if self._fill == self.chunk_bytes:
                self._flush_chunk()
        return len(data)

    def _drain(self):
        first = None
        while self._in_flight:
            future, region = self._in_flight.popleft()
            try:
                future.result()
            except BaseException as e:
                first = first or e
            self._free.append(region)
        if first is not None:
            raise first

    def close(self):
        """Write what is left, make the file durable, and publish it under its name."""
        if self.closed:
            return
        try:
            if not self._aborted:
                self._flush_chunk()
                self._drain()
                self._file.close()  # durable once this returns
                self._publish()
        except BaseException:
            self._discard()
            raise
        finally:
            self._pool.shutdown(wait=True)
            for r in self._free:
                r.free()
            super().close()

    def _publish(self):
        # One step: a reader (or a restart of the agent) sees the old checkpoint or the
        # new one, never neither and never a partial one.
        self.client.rename(self.temp_path, self.path, replace=True)
        self._published = True

    def _discard(self):
        self._aborted = True
        try:
            self._drain()
        except BaseException:
            pass
        try:
            self._file.close()
            self.client.remove(self.temp_path)
        except Error:
            pass

    def abort(self):
        """Discard everything written; nothing is published."""
        if self.closed:
            return
        self._discard()
        self.close()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        else:
            self.close()
        return False

    def __del__(self):
        # Never publish from the garbage collector: the data may be incomplete.
        if not self.closed and os.getpid() == getattr(self.client, "_pid", None):
            try:
                self.abort()
            except Exception:
                pass


class CheckpointReader(io.RawIOBase):
    """A read-only, seekable file object over a checkpoint. Reads are served from
    ``chunks_in_flight`` registered chunks; a miss reads that chunk and the following
    ones together (read-ahead, in parallel at the agent)."""

    def __init__(self, client, path, chunk_bytes, chunks_in_flight):
        super().__init__()
        self.client = client
        self.path = path
        self._file = client.open(path, "r")
        self.size = self._file.size
        self.chunk_bytes = chunk_bytes
        self._slots = [client.region(chunk_bytes, "w") for _ in range(max(1, chunks_in_flight))]
        self._cached = OrderedDict()  # chunk index -> (slot, bytes valid)
        self._pos = 0
        self.chunks_read = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        self._pos = _seek_position(self._pos, self.size, offset, whence)
        return self._pos

    def _load(self, first):
        last_chunk = (self.size - 1) // self.chunk_bytes
        wanted = [c for c in range(first, min(first + len(self._slots), last_chunk + 1)) if c not in self._cached]
        in_use = {slot for slot, _ in self._cached.values()}
        free = [i for i in range(len(self._slots)) if i not in in_use]
        while len(free) < len(wanted):
            _, (slot, _) = self._cached.popitem(last=False)
            free.append(slot)
        ops = []
        for c, slot in zip(wanted, free):
            at = c * self.chunk_bytes
            ops.append((False, self._file, self._slots[slot], 0, min(self.chunk_bytes, self.size - at), at, False))
        for c, slot, n in zip(wanted, free, self.client.submit(ops)):
            self._cached[c] = (slot, n)
        self.chunks_read += len(wanted)

    def readinto(self, b):
        if self.closed:
            raise Closed(f"checkpoint reader for {self.path} is closed")
        out = memoryview(b).cast("B")
        done = 0
        while done < len(out) and self._pos < self.size:
            c, within = divmod(self._pos, self.chunk_bytes)
            if c not in self._cached:
                self._load(c)
            self._cached.move_to_end(c)
            slot, valid = self._cached[c]
            n = min(len(out) - done, valid - within)
            if n <= 0:
                break  # the file is shorter than when it was opened
            with memoryview(self._slots[slot]) as view:
                out[done : done + n] = view[within : within + n]
            done += n
            self._pos += n
        return done

    def close(self):
        if self.closed:
            return
        try:
            self._file.close()
        except Error:
            pass
        for r in self._slots:
            r.free()
        super().close()


class Checkpoint:
    """Checkpoints under ``prefix`` (a directory of the container, created if needed).

    ``writer(name)`` gives a file object for ``torch.save`` (bounded chunks in flight;
    published atomically on close); ``reader(name)`` one for ``torch.load`` (parallel
    chunked reads).
    """

    def __init__(self, prefix, *, client=None, agent=None, chunk_bytes=None, chunks_in_flight=CHUNKS_IN_FLIGHT):
        self.client = client if client is not None else Client(agent)
        if not prefix.startswith("/"):
            raise InvalidArgument(f"prefix must be an absolute path in the container, not {prefix!r}")
        self.prefix = prefix.rstrip("/") or ""
        self.client.mkdir(self.prefix or "/", parents=True)
        limit = self.client.limits["max_io_bytes"]
        chunk = int(chunk_bytes or max(self.client.chunk_bytes, CHUNK_BYTES))
        self.chunk_bytes = max(4096, min(chunk, limit))
        self.chunks_in_flight = max(1, int(chunks_in_flight))

    def _path(self, name):
        if not name or "/" in name or name.startswith("."):
            raise InvalidArgument(f"checkpoint name must be a plain file name, not {name!r}")
        return f"{self.prefix}/{name}"

    def writer(self, name):
        return CheckpointWriter(self.client, self._path(name), self.chunk_bytes, self.chunks_in_flight)

    def reader(self, name):
        return CheckpointReader(self.client, self._path(name), self.chunk_bytes, self.chunks_in_flight)

    def names(self):
        """Published checkpoints (temporary files of writers in progress are hidden)."""
        return [n for n in self.client.listdir(self.prefix or "/") if not n.startswith(".")]

    def exists(self, name):
        return self.client.exists(self._path(name))

    def remove(self, name):
        self.client.remove(self._path(name))

    def __contains__(self, name):
        return self.exists(name)

