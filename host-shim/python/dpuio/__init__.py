"""dpuio: attach Python training jobs to a dpuio agent.

The agent (on the DPU) runs the storage client; this process only exposes memory.
A :class:`Client` attaches to the agent, :meth:`Client.region` registers memory,
:meth:`Client.open` opens files, and reads and writes move data between files and
regions, with the agent doing the copying. A :class:`Region` supports the buffer
protocol, so ``numpy.frombuffer(region, ...)`` and ``torch.frombuffer(region, ...)`` are
zero-copy views of what the agent wrote.

The agent address comes from ``Client(agent=...)``, else ``$DPUIO_AGENT``, else
``127.0.0.1:7300`` (as for the ``dpuio`` CLI).

Processes: a client notices when it is used in a new process (a ``fork``ed DataLoader
worker) and attaches again by itself; it can be pickled (``spawn``ed workers attach
when they unpickle it). Files and regions belong to the process that made them.

PyTorch datasets and checkpoints are in :mod:`dpuio.torch`; the machinery under them,
which needs only numpy, is in :mod:`dpuio.data`.
"""

import atexit
import io
import os
import threading
import weakref
from collections import OrderedDict, namedtuple

# libfabric's PSM dependency (libinfinipath) installs handlers for SIGINT, SIGTERM and
# crashes when it is loaded, which print a backtrace and exit(1): Ctrl-C would be no
# KeyboardInterrupt and SIGTERM no signal death. It reads this before installing them,
# and the native module loads it (see docs/dataplane.md, "Signals").
os.environ.setdefault("IPATH_NO_BACKTRACE", "1")

from . import _native  # noqa: E402 (after the environment above)
from ._errors import *  # noqa: F401,F403 (the public error classes)
from ._errors import Closed, InvalidArgument, NotFound, __all__ as _error_names
from ._native import File, Region

__all__ = ["Client", "File", "Region", "RegionFile", "Attr", "DirEntry", "TransportInfo", "DEFAULT_AGENT", "npy",
           *_error_names]
__version__ = _native.__version__

#: Where clients look for the agent when neither ``agent=`` nor ``$DPUIO_AGENT`` says.
DEFAULT_AGENT = "127.0.0.1:7300"

#: Rings of a Python client: concurrent submitting threads (checkpoint writers use
#: several). Each ring is a small registered region.
DEFAULT_RINGS = 4


class Attr(namedtuple("Attr", "kind size mode mtime_ns object_id")):
    """Attributes of a file (``kind == "file"``) or directory (``kind == "dir"``)."""

    __slots__ = ()

    @property
    def is_dir(self):
        return self.kind == "dir"

    @property
    def is_file(self):
        return self.kind == "file"


DirEntry = namedtuple("DirEntry", "name attr")

#: The data plane's transport (``Client.transport``): ``name`` is ``"ucx"``,
#: ``"ofi-shm"`` or ``"ofi-tcp"``; ``provider`` ``"ucx"`` or ``"ofi"``;
#: ``fabric_provider`` libfabric's provider (empty for UCX); ``detail`` one line of what
#: the transport says of the connection (UCX's lanes, e.g. ``posix/memory ...``).
TransportInfo = namedtuple("TransportInfo", "name provider fabric_provider detail")

#: Registered memory ``read_bytes``, ``write_bytes``, ``read_file`` and checkpoints keep
#: for reuse, per client and process (``Client(region_cache_bytes=...)``; 0 turns the
#: cache off). Registering costs a round trip and agent CPU; reusing costs neither.
DEFAULT_REGION_CACHE_BYTES = 256 << 20
#: The smallest size class of the region cache.
_MIN_CLASS_BYTES = 64 << 10


class _RegionCache:
    """Registered regions kept for reuse, in power-of-two size classes.

    Thread-safe. Bounded: at most ``limit_bytes`` in regions not in use; a region
    larger than that is registered per call. A region given back while a view of it
    is alive (an array the caller kept) is not reused (it is unmapped when the last
    view goes), so a cached region is never written under someone's array.
    """

    def __init__(self, limit_bytes, register):
        self.limit_bytes = int(limit_bytes)
        self._register = register  # nbytes -> Region ("rw")
        self._lock = threading.Lock()
        self._free = OrderedDict()  # id(region) -> region, oldest first
        self._free_bytes = 0
        self.stats = {"hits": 0, "registered": 0, "uncached": 0}

    @staticmethod
    def size_class(nbytes):
        return max(_MIN_CLASS_BYTES, 1 << (max(1, int(nbytes)) - 1).bit_length())

    def acquire(self, nbytes):
        """A region of at least ``nbytes`` no one else uses (give it back with
        :meth:`release`)."""
        size = self.size_class(nbytes)
        if size > self.limit_bytes:
            self.stats["uncached"] += 1
            return self._register(max(1, int(nbytes)))
        with self._lock:
            for key, r in self._free.items():
                if len(r) == size:
                    del self._free[key]
                    self._free_bytes -= size
                    self.stats["hits"] += 1
                    return r
        self.stats["registered"] += 1
        return self._register(size)

    def release(self, region):
        if region.freed or region.exports or len(region) > self.limit_bytes:
            region.free()
            return
        with self._lock:
            self._free[id(region)] = region
            self._free_bytes += len(region)
            while self._free_bytes > self.limit_bytes:
                _, old = self._free.popitem(last=False)
                self._free_bytes -= len(old)
                old.free()

    def clear(self):
        with self._lock:
            regions, self._free, self._free_bytes = list(self._free.values()), OrderedDict(), 0
        for r in regions:
            r.free()

    @property
    def free_bytes(self):
        return self._free_bytes


def _seek_position(current, size, offset, whence):
    """Where ``seek(offset, whence)`` leads from ``current`` in a file of ``size`` bytes
    (the arithmetic of every seekable file object here)."""
    if whence == io.SEEK_SET:
        pos = offset
    elif whence == io.SEEK_CUR:
        pos = current + offset
    elif whence == io.SEEK_END:
        pos = size + offset
    else:
        raise InvalidArgument(f"invalid whence {whence}")
    if pos < 0:
        raise InvalidArgument(f"negative seek position {pos}")
    return pos


class RegionFile(io.RawIOBase):
    """A read-only, seekable file object over bytes in memory, typically a region the
    agent filled: ``numpy.load`` takes it for ``.npy`` and ``.npz`` (a zip archive,
    which needs ``seek``/``tell``), ``torch.load``, ``zipfile``, ``pickle`` too.

    ``readinto`` copies once, straight from the region into the caller's buffer;
    :meth:`getbuffer` is a view with no copy (``dpuio.npy(f.getbuffer())``).

    Args:
        buf: anything with the buffer protocol (a :class:`Region`, a memoryview).
        size: bytes of ``buf`` that are the file (default: all of it).
        on_close: called once with no arguments when the file is closed (the client
            gives its region back to its cache then).
    """

    def __init__(self, buf, size=None, on_close=None):
        super().__init__()
        # Each of these views holds the buffer; all are released on close, so a region's
        # export count says whether anything else still looks at it.
        self._views = [memoryview(buf)]
        self._views.append(self._views[0].cast("B"))
        if size is not None:
            if not 0 <= size <= len(self._views[-1]):
                raise InvalidArgument(f"size {size} outside the {len(self._views[-1])}-byte buffer")
            self._views.append(self._views[-1][:size])
        self._view = self._views[-1]
        self._pos = 0
        self._on_close = on_close

    @property
    def size(self):
        return len(self._view)

    def readable(self):
        return True

    def seekable(self):
        return True

    def _check(self):
        if self.closed:
            raise ValueError("I/O operation on closed file")

    def tell(self):
        self._check()
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        self._check()
        self._pos = _seek_position(self._pos, len(self._view), offset, whence)
        return self._pos

    def readinto(self, b):
        self._check()
        out = memoryview(b).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size=-1):
        # One copy (bytes() of the slice), not RawIOBase's bytearray-then-bytes.
        self._check()
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        start = min(self._pos, end)
        self._pos = max(self._pos, end)
        return bytes(self._view[start:end])

    def readall(self):
        return self.read(-1)

    def getbuffer(self):
        """A read-only view of the whole file (no copy); valid while the file is
        open, and while the view lives the region is not reused."""
        self._check()
        return self._view.toreadonly()

    def close(self):
        if self.closed:
            return
        for view in reversed(self._views):
            try:
                view.release()  # views from getbuffer() live on: the region is not reused
            except BufferError:
                pass
        super().close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

_MODES = {
    # mode: (write, create, exclusive, truncate)
    "r": (False, False, False, False),
    "r+": (True, False, False, False),
    "w": (True, True, False, True),
    "x": (True, True, True, False),
    "a+": (True, True, False, False),
}

_CLIENTS = weakref.WeakSet()


def _after_fork_in_child():
    # A thread of the parent may have held a client's lock at fork time; that thread
    # does not exist here, so the lock would stay taken forever.
    for client in list(_CLIENTS):
        client._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Client:
    """A connection to the agent for this process.

    Namespace calls go through a control-only session; the data plane (regions, rings,
    a UCX worker) is set up on first use by a second session, so a process that only
    lists files never starts a transport, and a DataLoader forking workers from it
    forks nothing it cannot use.

    Args:
        agent: ``host:port`` (mutual TLS) or ``http://host:port`` (plaintext agents);
            default ``$DPUIO_AGENT``, else ``127.0.0.1:7300``.
        tenant: tenant to attach as (plaintext agents only: with TLS the client
            certificate decides); default ``$DPUIO_TENANT``, else the agent's default.
        cert, key, ca: client certificate, its key and the agent's CA (PEM files);
            default ``$DPUIO_CERT``/``$DPUIO_KEY``/``$DPUIO_CA``, else ``client.pem``,
            ``client.key`` and ``ca.pem`` in ``$DPUIO_CONFIG_DIR`` or ``~/.config/dpuio``,
            where a local agent writes a development bundle on its first start.
        token: a capability token narrowing what this client may do (from a
            parent's ``Client.delegate``); default ``$DPUIO_TOKEN``.
        name: shown in the agent's logs.
        transports: the data plane, ``"ucx-shm"``, ``"ucx-tcp"``, ``"ofi-shm"``,
            ``"ofi-tcp"`` (libfabric) or ``"auto"`` (the first of UCX, ofi-shm,
            ofi-tcp the agent offers); ``"shm"``/``"tcp"`` mean UCX; default
            ``$DPUIO_TRANSPORT``, else ``"auto"``.
        rings: threads that can have requests in flight at once (at first: a call
            that finds every ring busy for 20 ms registers another, up to four
            times this many).
        ring_entries: queue depth of one ring (a power of two).
        timeout: seconds a data-plane wait may take.
        connect_timeout: seconds to connect.
        region_cache_bytes: registered memory kept for reuse by :meth:`read_bytes`,
            :meth:`write_bytes`, :meth:`read_file` and checkpoints (default 256 MiB;
            0: register per call).
        resume: seconds calls wait for a restarted agent while the client attaches
            again, re-registers its memory and re-opens its files (calls then go on
            as if nothing happened); 0 turns it off. Default: ``$DPUIO_RESUME_S``,
            else 60.
    """

    def __init__(
        self,
        agent=None,
        *,
        tenant=None,
        name=None,
        transports=None,
        rings=DEFAULT_RINGS,
        ring_entries=0,
        timeout=0.0,
        connect_timeout=0.0,
        cert=None,
        key=None,
        ca=None,
        token=None,
        region_cache_bytes=DEFAULT_REGION_CACHE_BYTES,
        resume=None,
    ):
        self._options = dict(
            cert=os.fspath(cert) if cert is not None else None,
            key=os.fspath(key) if key is not None else None,
            ca=os.fspath(ca) if ca is not None else None,
            token=token,
            agent=agent or os.environ.get("DPUIO_AGENT") or DEFAULT_AGENT,
            tenant=tenant if tenant is not None else os.environ.get("DPUIO_TENANT", ""),
            name=name,
            transports=transports or os.environ.get("DPUIO_TRANSPORT") or "auto",
            rings=int(rings or 0),
            ring_entries=int(ring_entries or 0),
            timeout=float(timeout or 0.0),
            connect_timeout=float(connect_timeout or 0.0),
            region_cache_bytes=int(region_cache_bytes),
            resume=None if resume is None else float(resume),
        )
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._control = None
        self._data = None
        self._cache = None
        self._closed = False
        _CLIENTS.add(self)
        self._ctl()  # attach now, so a wrong address fails here and not later


    # -- sessions ---------------------------------------------------------------

    def _session(self, data):
        if self._closed:
            raise Closed("the dpuio client is closed")
        with self._lock:
            pid = os.getpid()
            if pid != self._pid:
                # A new process (fork): the parent's sessions are unusable here and are
                # leaked on purpose (their destructors would touch the parent's state).
                self._pid, self._control, self._data, self._cache = pid, None, None, None
            if data:
                if self._data is None:
                    self._data = self._attach(self._options["transports"])
                return self._data
            if self._control is None:
                self._control = self._attach(None)
            return self._control

    def _attach(self, transports):
        o = self._options
        name = o["name"] or f"python pid {os.getpid()}"
        _watch_exit()
        session = _native.Session(
            o["agent"],
            tenant=o["tenant"],
            client_name=name if transports is None else f"{name} data",
            transports=transports,
            rings=o["rings"],
            ring_entries=o["ring_entries"],
            timeout_s=o["timeout"],
            connect_timeout_s=o["connect_timeout"],
            cert=o["cert"],
            key=o["key"],
            ca=o["ca"],
            token=o["token"],
            resume_s=o["resume"],
        )
        _LIVE_SESSIONS.add(session)
        return session

    def _ctl(self):
        return self._session(False)

    def _dp(self):
        return self._session(True)

    def _regions(self):
        """This process's region cache (made on first use)."""
        session = self._dp()
        with self._lock:
            if self._cache is None:
                self._cache = _RegionCache(self._options["region_cache_bytes"], lambda n: session.region(n, "rw"))
            return self._cache

    def __reduce__(self):
        # spawn-ed workers get a client that attaches in their own process.
        o = dict(self._options)
        agent = o.pop("agent")
        return (_rebuild_client, (agent, o))

    # -- state ------------------------------------------------------------------

    @property
    def agent(self):
        return self._options["agent"]

    @property
    def closed(self):
        return self._closed

    @property
    def tenant(self):
        return self._ctl().tenant

    @property
    def container(self):
        return self._ctl().container

    @property
    def chunk_bytes(self):
        """The container's chunk size: a good request size."""
        return self._ctl().chunk_bytes

    @property
    def limits(self):
        """The agent's limits for the data-plane session (dict)."""
        return self._dp().limits

    @property
    def transport(self):
        """The data plane's transport (:class:`TransportInfo`): what ``"auto"`` chose.
        Sets up the data plane if it is not up yet."""
        t = self._dp().transport
        return TransportInfo(*t) if t is not None else None

    @property
    def region_cache(self):
        """The region cache's counters: ``hits``, ``registered``, ``uncached`` and
        ``free_bytes`` (registered memory kept for reuse)."""
        with self._lock:
            cache = self._cache if self._pid == os.getpid() else None
        if cache is None:
            return {"hits": 0, "registered": 0, "uncached": 0, "free_bytes": 0}
        return {**cache.stats, "free_bytes": cache.free_bytes}

    @property
    def progress_cpu_s(self):
        """CPU seconds of the data plane's progress thread (0 on shared memory)."""
        with self._lock:
            data = self._data if self._pid == os.getpid() else None
        return data.progress_cpu_s if data is not None else 0.0

    def close(self):
        """Detach from the agent (written files are synced). Later calls raise
        :class:`dpuio.Closed`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            sessions = [s for s in (self._control, self._data) if s is not None]
            same_process = self._pid == os.getpid()
            cache, self._cache = self._cache, None
        if cache is not None and same_process:
            cache.clear()
        if same_process:
            first = None
            for s in sessions:
                try:
                    s.detach()
                except Exception as e:  # detach both, report the first failure
                    first = first or e
            if first is not None:
                raise first

    detach = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        state = " closed" if self._closed else ""
        return f"<dpuio.Client agent={self.agent!r}{state}>"

    # -- namespace --------------------------------------------------------------

    def stat(self, path):
        """Attributes of ``path`` (:class:`Attr`)."""
        return Attr(*self._ctl().stat(path))

    def exists(self, path):
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def lookup(self, paths):
        """Attributes of many paths in few calls: one :class:`Attr` or
        :class:`dpuio.Error` (not raised) per path."""
        return [r if isinstance(r, BaseException) else Attr(*r) for r in self._ctl().lookup(list(paths))]

    def mkdir(self, path, parents=False):
        """Create a directory; with ``parents``, also missing parents and no error if
        it exists."""
        return Attr(*self._ctl().mkdir(path, parents))

    def makedirs(self, path):
        return self.mkdir(path, parents=True)

    def scandir(self, path, batch_size=0):
        """Iterate over a directory's entries (:class:`DirEntry`), fetched in batches
        so a huge directory never has to fit in memory."""
        for batch in self._ctl().readdir(path, batch_size):
            for name, attr in batch:
                yield DirEntry(name, Attr(*attr))

    def listdir(self, path):
        """Names in a directory, in name order."""
        return [e.name for e in self.scandir(path)]

    def list_files(self, path, concurrency=8):
        """Every file under ``path``, recursively: sorted ``(path, size)`` pairs.
        Directories are listed with batched readdir, ``concurrency`` at a time."""
        return self._ctl().list_files(path, concurrency)

    def remove(self, path, recursive=False):
        """Remove a file or an empty directory; ``recursive`` removes a whole tree."""
        self._ctl().remove(path, recursive)

    def rename(self, src, dst, replace=False):
        """Rename; fails with :class:`dpuio.AlreadyExists` if ``dst`` exists, unless
        ``replace``: then a file at ``dst`` is replaced in one step (``src`` and ``dst``
        must be files)."""
        self._ctl().rename(src, dst, replace)

    def truncate(self, path, size):
        self._ctl().truncate(path, size)

    def sync(self):
        """Make every acknowledged change in the container durable."""
        self._ctl().sync()

    # -- data -------------------------------------------------------------------

    def open(self, path, mode="r"):
        """Open a file: ``"r"`` read, ``"r+"`` read-write, ``"w"`` create or truncate,
        ``"x"`` create exclusively, ``"a+"`` read-write, created if missing."""
        try:
            write, create, exclusive, truncate = _MODES[mode]
        except KeyError:
            raise InvalidArgument(f"mode must be one of {sorted(_MODES)}, not {mode!r}") from None
        return self._dp().open(path, write, create, exclusive, truncate)

    def open_many(self, paths):
        """Open many files read-only at once (in flight together). Raises the first
        failure, after closing the files that did open."""
        session = self._dp()
        results = session.open_many(list(paths))
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            session.close_many([r for r in results if not isinstance(r, BaseException)])
            raise failed
        return results

    def close_many(self, files):
        """Close many files at once."""
        files = list(files)
        if files:
            self._dp().close_many(files)

    def region(self, nbytes, access="rw"):
        """Register ``nbytes`` of memory: ``access`` ``"rw"``, ``"w"`` (the agent
        writes it: reads land there) or ``"r"`` (the agent reads it)."""
        return self._dp().region(int(nbytes), access)

    def submit(self, ops):
        """Submit many requests through one ring and wait for all of them.

        Each op is ``(write, file, region, region_offset, length, file_offset, sync)``.
        Returns the bytes moved per op; raises the first failure. Requests larger than
        the agent allows are split.
        """
        return self._dp().submit(list(ops))

    def read_many(self, reads):
        """Read ``(file, region, region_offset, length, file_offset)`` requests at once;
        returns bytes read per request."""
        return self.submit([(False, f, r, ro, n, fo, False) for f, r, ro, n, fo in reads])

    def read_bytes(self, path):
        """A whole file as ``bytes`` (one copy out of registered memory the client
        keeps for reuse; datasets use regions directly)."""
        with self.read_file(path) as f:
            return f.read()

    def read_file(self, path):
        """A whole file read into registered memory, as a read-only seekable
        :class:`RegionFile`: ``numpy.load(client.read_file("a.npz"))`` works, and
        ``f.getbuffer()`` is a view with no copy. Close it (or use ``with``) to give the
        memory back to the client's region cache."""
        with self.open(path) as f:
            if f.size == 0:
                return RegionFile(b"")
            cache = self._regions()
            r = cache.acquire(f.size)
            try:
                n = f.read_into(r, 0, length=f.size)
            except BaseException:
                cache.release(r)
                raise
        return RegionFile(r, n, on_close=lambda: cache.release(r))

    def write_bytes(self, path, data, sync=False):
        """Replace ``path`` with ``data`` in one step, as an object store's put does:
        the bytes go to a temporary file beside it (``.NAME.dpuio-put.SUFFIX``), made
        durable, then renamed over ``path``. An interrupted call leaves the old file
        whole (and perhaps, until its session ends, the temporary file, which nothing
        reads and the agent then removes). ``sync`` also makes
        the new directory entry durable before returning (a container-wide sync):
        without it, the new file survives a restart of the agent but not necessarily a
        power loss of the DPU."""
        data = memoryview(data).cast("B")
        temp = _native.Session.put_temp_path(path)
        try:
            with self.open(temp, "x") as f:
                if len(data):
                    cache = self._regions()
                    r = cache.acquire(len(data))
                    try:
                        with memoryview(r) as view:
                            view[: len(data)] = data
                        f.write_from(r, 0, length=len(data))
                    finally:
                        cache.release(r)
            # durable once closed; now in place in one step
            self._ctl().rename(temp, path, True)
        except BaseException:
            try:
                self._ctl().remove(temp)
            except Error:
                pass  # never created, or no delete right: the put's own error matters
            raise
        if sync:
            self._ctl().sync()
        return len(data)


# Sessions still alive when a process exits are detached then, so the agent forgets
# them at once instead of when their lease lapses. DataLoader workers leave through
# multiprocessing, which runs its finalizers (not atexit handlers); the main process
# runs them at exit too. A session dropped earlier detaches itself.
#
# SIGTERM (a DataLoader shutting down a worker that did not stop in time, a batch
# scheduler) ends a process without either: a handler detaches first and then does
# what was there before (the previous Python handler, or dying of the signal).
# SIGKILL cannot be caught: the agent notices the closed connection instead.
# DPUIO_SIGTERM_HANDLER=0 leaves SIGTERM alone.
_LIVE_SESSIONS = weakref.WeakSet()
_EXIT_HOOK_PID = None
_PREVIOUS_SIGTERM = None


def _watch_exit():
    global _EXIT_HOOK_PID
    if _EXIT_HOOK_PID != os.getpid():
        _EXIT_HOOK_PID = os.getpid()
        # Here, not at the top: importing multiprocessing (socket, pickle, subprocess...)
        # is most of what `import dpuio` would cost, and a process that never attaches
        # needs none of it. A DataLoader worker has it imported already.
        import multiprocessing.util

        multiprocessing.util.Finalize(None, _detach_live_sessions, exitpriority=10)
        atexit.register(_detach_live_sessions)
        _install_sigterm_handler()


def _install_sigterm_handler():
    global _PREVIOUS_SIGTERM
    if os.environ.get("DPUIO_SIGTERM_HANDLER", "1") == "0":
        return
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal works in the main thread only; a later client may
    import signal  # here: it imports enum, which `import dpuio` alone does not need

    current = signal.getsignal(signal.SIGTERM)
    # None: a handler set outside Python, which we cannot chain; SIG_IGN: asked for.
    if current is _on_sigterm or current is None or current is signal.SIG_IGN:
        return
    _PREVIOUS_SIGTERM = current
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame):
    import signal  # imported already: installing this handler did

    _detach_live_sessions()
    previous = _PREVIOUS_SIGTERM
    if callable(previous):
        previous(signum, frame)
        return
    # The default: die of the signal, as the process would have without us.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _detach_live_sessions():
    for s in list(_LIVE_SESSIONS):
        try:
            s.detach()  # a no-op for sessions of another process, and when detached
        except Exception:
            pass


def _rebuild_client(agent, options):
    return Client(agent, **options)


def npy(buf):
    """A numpy array over a ``.npy`` file's bytes, without copying the data (a view of
    ``buf``, typically a sample in registered memory).

    Use as a dataset's ``transform_fn``. The array keeps ``buf`` (and so the region
    under it) alive.
    """
    import io

    import numpy as np
    from numpy.lib import format as npformat

    view = memoryview(buf)
    head = io.BytesIO(view[: min(len(view), 65536)])
    version = npformat.read_magic(head)
    if version == (1, 0):
        shape, fortran, dtype = npformat.read_array_header_1_0(head)
    else:
        shape, fortran, dtype = npformat.read_array_header_2_0(head)
    if dtype.hasobject:
        raise InvalidArgument("npy files with Python objects cannot be viewed without unpickling")
    count = 1
    for d in shape:
        count *= d
    array = np.frombuffer(view, dtype=dtype, count=count, offset=head.tell())
    return array.reshape(shape, order="F" if fortran else "C")
