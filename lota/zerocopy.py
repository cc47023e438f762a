"""A small hit's body sent from the page cache, never copied through Python.

A 64 KiB hit read into a buffer (``preadv``) and written from it (``writev``) is copied
twice on its way to the socket; nginx sends its cached files with ``sendfile(2)``, which
copies none. Here a :class:`FileSpan` names a hit's bytes (a descriptor, an offset, a
count); :func:`resident` says whether the page cache holds all of them (``cachestat(2)``,
Linux 6.5+), so that sending them does not wait for a drive on the event loop (but for
pages still being read in, which it counts as held: a span is made only of bytes read
whole from memory, now or before, or written by a fill,
:func:`lota.cache.store.reader.read_or_span`); :func:`send`
writes a response's head with ``MSG_MORE`` and then its span with ``sendfile(2)``: one
segment on the wire for both, two system calls, as many as the copy took.

Where the kernel lacks cachestat(2) or ``MSG_MORE``, or the C library cannot be loaded
(:data:`AVAILABLE`), :func:`resident` says False and hits are read and written as bytes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

PAGE = os.sysconf("SC_PAGE_SIZE")
# cachestat(2)'s number, the same on every architecture that has it (Linux 6.5+).
_SYS_CACHESTAT = 451
# struct cachestat_range {off, len}, then struct cachestat {nr_cache, nr_dirty,
# nr_writeback, nr_evicted, nr_recently_evicted}: seven 64-bit words.
_Words = ctypes.c_uint64 * 7


def _libc() -> ctypes.CDLL | None:
    """The C library the process runs with (glibc or musl), by its symbols."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()
_syscall = None if _LIBC is None else _LIBC.syscall
if _syscall is not None:
    # No argtypes: each call passes what needs no converting (ints as C ints, which libffi
    # widens to the whole register syscall(3) reads as a long; pointers made once below):
    # converting them cost a microsecond a hit.
    _syscall.restype = ctypes.c_long
_MSG_MORE = getattr(socket, "MSG_MORE", 0)
# What cachestat(2) is asked and says, for the event loop's thread only (every hit's check
# runs there; a new array per call cost a microsecond too): its range, then its answer.
_WORDS = _Words()
_RANGE = ctypes.c_void_p(ctypes.addressof(_WORDS))
_STAT = ctypes.c_void_p(ctypes.addressof(_WORDS) + 16)


def _cachestat(fd: int, offset: int, count: int) -> int | None:
    """Pages of `count` bytes at `offset` of file `fd` the page cache holds; None if
    cachestat(2) failed (errno says why)."""
    assert _syscall is not None
    _WORDS[0] = offset
    _WORDS[1] = count
    done: int = _syscall(_SYS_CACHESTAT, fd, _RANGE, _STAT, 0)
    return _WORDS[2] if done == 0 else None


def _probe() -> bool:
    """Whether this kernel has cachestat(2) and lets this process call it: asked of no
    file, it says EBADF (without it ENOSYS; a container's filter may say EPERM)."""
    if _syscall is None or not _MSG_MORE:
        return False
    return _cachestat(-1, 0, 0) is None and ctypes.get_errno() == errno.EBADF


AVAILABLE = _probe()


class Borrowed(socket.socket):
    """A connection's socket as the event loop's transport holds it, to write to directly:
    never closed from here, not even when collected (the transport closes it); call
    :meth:`detach` once the connection is lost."""

    __slots__ = ()

    def __del__(self) -> None:
        self.detach()


def borrow(fd: int) -> Borrowed:
    """The socket `fd` (a transport's, non-blocking), as :class:`Borrowed`: a write it does
    not take now fails at once, whatever ``socket.setdefaulttimeout`` says."""
    sock = Borrowed(fileno=fd)
    sock.settimeout(0.0)
    return sock


@dataclass(slots=True)
class FileSpan:
    """`count` bytes at `offset` of the open file `fd`, which the page cache held when the
    span was made (:func:`resident`). The descriptor is not this object's: it stays open
    only until the event loop goes on, so a span is sent or read at once."""

    fd: int
    offset: int
    count: int
    short: Callable[[], object] | None = None
    """Called when the file turns out not to hold the span (cut short, or failing): the
    cache drops it."""

    def read(self, skip: int = 0) -> bytes | None:
        """The span's bytes from `skip` on; None if the file no longer holds them all
        (then :attr:`short` is called)."""
        want = self.count - skip
        try:
            data = os.pread(self.fd, want, self.offset + skip)
        except OSError:
            data = b""
        if len(data) == want:
            return data
        if self.short is not None:
            self.short()
        return None


def resident(fd: int, offset: int, count: int) -> bool:
    """Whether the page cache holds every byte of `count` (> 0) at `offset` of file `fd`,
    counting pages still being read in from the drive (cachestat does not tell them
    apart). Always False where cachestat(2) is not to be had (:data:`AVAILABLE`). On the
    event loop's thread only."""
    if not AVAILABLE:
        return False
    # _cachestat, written out: this runs for every small hit.
    _WORDS[0] = offset
    _WORDS[1] = count
    if _syscall(_SYS_CACHESTAT, fd, _RANGE, _STAT, 0) != 0:  # type: ignore[misc]
        return False
    cached: int = _WORDS[2]
    return cached >= (offset + count - 1) // PAGE - offset // PAGE + 1


def send(sock: socket.socket, head: bytes, span: FileSpan) -> int:
    """Write `head` then `span` on the non-blocking socket `sock` as far as it takes them
    now: the bytes written, of ``len(head) + span.count``. Fewer when the socket's buffer
    fills, it fails or the file ends early: the caller writes the rest, or gives up the
    connection. Never raises."""
    try:
        sent = sock.send(head, _MSG_MORE)
    except OSError:  # EAGAIN: the socket's buffer is full; EPIPE...: it is gone
        return 0
    if sent < len(head):
        return sent
    out = sock.fileno()
    done = 0
    while done < span.count:
        try:
            n = os.sendfile(out, span.fd, span.offset + done, span.count - done)
        except OSError:
            break
        if n == 0:
            break
        done += n
    return sent + done
