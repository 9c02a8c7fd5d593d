"""The ``dpuio.Error`` hierarchy.

Every error the package raises is a :class:`Error`. The subclasses follow the codes of
the C ABI (``DPUIO_E_*``); where Python has a built-in class for the same idea the
subclass derives from it too, so ``except FileNotFoundError`` keeps working.
"""

__all__ = [
    "Error",
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "FailedPrecondition",
    "ResourceExhausted",
    "OutOfRange",
    "Unavailable",
    "TimedOut",
    "Busy",
    "BackendError",
    "IntegrityError",
    "Closed",
    "Unsupported",
    "ProtocolError",
    "InternalError",
    "TransformError",
]


class Error(Exception):
    """Base class of every dpuio error. ``code`` names the kind (as in the C ABI)."""

    code = "INTERNAL"


class InvalidArgument(Error, ValueError):
    """A caller mistake: bad value, a range outside a region, a request too large."""

    code = "INVALID_ARGUMENT"


class NotFound(Error, FileNotFoundError):
    """No such file or directory."""

    code = "NOT_FOUND"


class AlreadyExists(Error, FileExistsError):
    """The path exists already."""

    code = "ALREADY_EXISTS"


class PermissionDenied(Error, PermissionError):
    """Not allowed: a write through a read-only file or region, or by the tenant's rights."""

    code = "PERMISSION_DENIED"


class FailedPrecondition(Error):
    """The entry is in the wrong state: directory not empty, not a directory, ..."""

    code = "FAILED_PRECONDITION"


class ResourceExhausted(Error):
    """An agent limit: sessions, open files, regions."""

    code = "RESOURCE_EXHAUSTED"


class OutOfRange(Error, IndexError):
    """A range outside a region or a file."""

    code = "OUT_OF_RANGE"


class Unavailable(Error, ConnectionError):
    """The agent cannot be reached, or it ended the session."""

    code = "UNAVAILABLE"


class TimedOut(Error, TimeoutError):
    """A completion did not arrive in time."""

    code = "TIMED_OUT"


class Busy(Error):
    """The agent kept refusing a request over a session or tenant limit; retry later."""

    code = "BUSY"


class BackendError(Error, OSError):
    """The storage backend failed."""

    code = "IO"


class IntegrityError(Error):
    """Data failed an integrity check; none was released."""

    code = "INTEGRITY"


class Closed(Error):
    """Used after close, free or detach, or in another process than the one that made it."""

    code = "CLOSED"


class Unsupported(Error):
    """The agent does not implement this call."""

    code = "UNSUPPORTED"


class ProtocolError(Error):
    """The agent answered something this library cannot use."""

    code = "PROTOCOL"


class InternalError(Error):
    """A bug in dpuio: please report it."""

    code = "INTERNAL"


class TransformError(Error):
    """A dataset's ``transform_fn`` raised; the original exception is ``__cause__``."""

    code = "TRANSFORM"


# Shown (and pickled) as dpuio.NotFound etc., where users find them.
for _name in __all__:
    globals()[_name].__module__ = "dpuio"
del _name
