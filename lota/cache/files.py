"""The blocking file operations of the chunk store. They run on the store's I/O threads,
never on the event loop.

They are methods of one class so that tests can inject the failures a real disk produces
(``ENOSPC``, ``EIO``) by subclassing it: a full or failing drive cannot be produced on
demand in a test without mounting file systems.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import threading
from collections.abc import Callable, Iterable

import xxhash

from lota.cache.layout import DIR_BYTES
from lota.errors import LotaError

_READ_BUFFER = 1024 * 1024
_GONE = (errno.ENOENT, errno.ENOTDIR)
LOCK_NAME = "lota.lock"
"""In each cache directory: held (flock) by the one process that uses the directory."""


class ChunkDamaged(LotaError):
    """A chunk file does not hold the bytes its index row promises (length or digest)."""


class DirLocked(LotaError):
    """Another process holds the lock of a cache directory; `holder` says which, as it
    wrote it there ("pid 1234 on host h"), or "another process" if it has not yet."""

    def __init__(self, lock: str, holder: str) -> None:
        super().__init__(f"{lock} is held by {holder}")
        self.lock = lock
        self.holder = holder


def in_use(root: str, exc: DirLocked) -> str:
    """What a start that finds cache directory `root` held says."""
    return f"cache directory {root} is in use by {exc.holder} (lock {exc.lock})"


def unusable(root: str, exc: OSError) -> str:
    """What a start that cannot use cache directory `root` says."""
    return f"cannot use cache directory {root}: {exc}"


class ChunkFiles:
    """Create, fill, publish, check and delete chunk files."""

    def __init__(self) -> None:
        # Publishing a chunk (rename) and deleting an orphan found by the sweep exclude each
        # other, so that the sweep never deletes a file a fill has just published.
        self.publish_lock = threading.Lock()

    def create(self, directory: str, name: str) -> tuple[int, int]:
        """Open a new temp file `name` in `directory` (made if missing).

        Returns (fd, directories created). Retries if a concurrent delete removes the
        directory, now empty, between its creation and the open.
        """
        made = 0
        for _ in range(3):
            made += self._makedirs(directory)
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                return os.open(os.path.join(directory, name), flags, 0o644), made
            except FileNotFoundError:
                continue
        raise OSError(errno.ENOENT, "chunk directory keeps disappearing", directory)

    @staticmethod
    def _makedirs(directory: str) -> int:
        parent = os.path.dirname(directory)
        made = 0
        for path in (parent, directory):
            try:
                os.mkdir(path, 0o755)
                made += 1
            except FileExistsError:
                pass
        return made

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def publish(self, fd: int, temp: str, final: str, fsync: bool) -> None:
        """Make the temp file the chunk: fsync (optional), close, rename. Always closes `fd`."""
        try:
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        with self.publish_lock:
            os.rename(temp, final)

    def discard(self, fd: int, paths: Iterable[str]) -> int:
        """Close `fd` (if >= 0) and delete `paths`; returns directories removed."""
        if fd >= 0:
            os.close(fd)
        return self.unlink(paths)

    def unlink(self, paths: Iterable[str]) -> int:
        """Delete files (missing ones are fine) and then their directories if now empty.

        Returns the number of directories removed, for the store's accounting.
        """
        dirs: set[str] = set()
        for path in paths:
            try:
                os.unlink(path)
            except OSError as exc:
                if exc.errno not in _GONE:
                    raise
            dirs.add(os.path.dirname(path))
        return sum(self._prune(d) for d in dirs)

    def unlink_orphan(self, path: str, claimed: Callable[[], bool]) -> int:
        """Delete a file the index does not know, unless a fill claimed its name meanwhile."""
        with self.publish_lock:
            if claimed():
                return 0
            return self.unlink([path])

    @staticmethod
    def _prune(directory: str) -> int:
        removed = 0
        for path in (directory, os.path.dirname(directory)):
            try:
                os.rmdir(path)
            except OSError:  # not empty (the common case), or already gone
                break
            removed += 1
        return removed

    def open_chunk(self, path: str, length: int, digest: int | None) -> int:
        """Open a chunk for reading; check its length and, if `digest` is given, its bytes."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size != length:
                raise ChunkDamaged(f"{path}: length is not {length}")
            if digest is not None and self.digest(fd, length) != digest:
                raise ChunkDamaged(f"{path}: digest mismatch")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def verify(self, path: str, length: int, digest: int) -> None:
        """Raise ChunkDamaged unless the file holds exactly the promised bytes."""
        os.close(self.open_chunk(path, length, digest))

    @staticmethod
    def digest(fd: int, length: int) -> int:
        """xxh3-64 of the first `length` bytes of `fd`, read through a bounded buffer."""
        h = xxhash.xxh3_64()
        buffer = bytearray(min(_READ_BUFFER, max(length, 1)))
        view = memoryview(buffer)
        offset = 0
        while offset < length:
            n = os.preadv(fd, [view[: length - offset]], offset)
            if n == 0:
                break
            h.update(view[:n])
            offset += n
        return h.intdigest()

    def scan(self, top: str) -> list[tuple[str, list[tuple[str, int]]]]:
        """The files of each leaf directory under ``chunks/<top>``: [(dir, [(name, size)])]."""
        return [(leaf, self._files_in(leaf)) for leaf in _subdirs(top)]

    @staticmethod
    def _files_in(leaf: str) -> list[tuple[str, int]]:
        files: list[tuple[str, int]] = []
        try:
            with os.scandir(leaf) as entries:
                for entry in entries:
                    try:
                        files.append((entry.name, entry.stat(follow_symlinks=False).st_size))
                    except FileNotFoundError:
                        continue
        except FileNotFoundError:  # pruned since it was listed
            pass
        return files

    def prepare(self, root: str) -> int:
        """Make ``<root>/chunks``; return what the directories of the layout add to
        ``du -sb`` today (the root and ``chunks`` included)."""
        chunks = os.path.join(root, "chunks")
        os.makedirs(chunks, exist_ok=True)
        tops = _subdirs(chunks)
        return (2 + len(tops) + sum(len(_subdirs(top)) for top in tops)) * DIR_BYTES

    def lock(self, root: str) -> int:
        """Take the exclusive lock of `root` (creating ``lota.lock``) and write who holds
        it; returns the descriptor, which holds the lock until it is closed (or the
        process dies, even by ``kill -9``). Raises DirLocked if another process holds it,
        OSError if the file cannot be created or written (a read-only drive)."""
        path = os.path.join(root, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 512, 0).decode(errors="replace").strip()
                raise DirLocked(path, holder or "another process") from None
            _write_holder(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def space(root: str) -> tuple[int, int]:
        """(bytes free for LOTA, device id) of the file system holding `root`."""
        fs = os.statvfs(root)
        return fs.f_bavail * fs.f_frsize, os.stat(root).st_dev

    def tops(self, root: str) -> list[str]:
        """The first-level directories under ``<root>/chunks``, to scan one at a time."""
        return _subdirs(os.path.join(root, "chunks"))


def _write_holder(fd: int) -> None:
    """Say who holds the lock, for whoever finds it taken. Only the flock counts: a drive
    too full for these few bytes (filled by an older LOTA, say) must not stop a start."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise


def _subdirs(path: str) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []
