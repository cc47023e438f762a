"""What a worker process is told by its supervisor, through one variable: ``LOTA_WORKER``.

The supervisor sets it (JSON) in each worker's environment; a worker reads it once at
start (:meth:`WorkerSpec.from_environment`). No variable: the process is a node alone
(``workers = 1``) or the supervisor itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import stat
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from lota.config import Config

VARIABLE = "LOTA_WORKER"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Worker `index` of `count`."""

    index: int
    count: int
    listen_fd: int
    """The listening socket the supervisor bound for this worker (SO_REUSEPORT)."""
    run_dir: str
    """Where the workers' Unix sockets are (one directory per supervisor)."""
    secret: str
    """Signs the workers' calls to one another when there is no cluster secret."""
    supervisor: int = 0
    """The supervisor's process id: a worker stops when that process is gone."""
    config_path: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    """The settings the supervisor was given on its command line (and, with
    ``--embedded-origin``, the origin it started)."""

    def to_environment(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_environment(cls) -> WorkerSpec | None:
        raw = os.environ.get(VARIABLE)
        return cls(**json.loads(raw)) if raw else None

    def stop_with_supervisor(self) -> None:
        """Have the kernel SIGTERM this worker (which drains) when its supervisor dies,
        however it dies (SIGKILL, the OOM killer): no orphan keeps serving its socket.
        Until the worker's event loop takes SIGTERM over (:func:`lota.node.serve.serve`),
        and if the supervisor is gone already, it leaves at once (:meth:`leave`)."""
        signal.signal(signal.SIGTERM, self._leave_now)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if self.supervisor and os.getppid() != self.supervisor:  # it died before that
            self._leave_now()

    def _leave_now(self, *_: object) -> NoReturn:
        """Stop before serving: nothing to drain yet, but the run directory to leave."""
        self.leave()
        raise SystemExit(128 + signal.SIGTERM)

    def leave(self) -> None:
        """Remove this worker's socket files (its descriptor server removes its own as it
        closes; not if that failed) and, if the supervisor is gone (killed: it removes
        the run directory on a stop of its own), every socket there nobody listens on
        (a sibling's killed before it, or closed as it stops), then the directory with
        the last worker to leave: nothing is left behind in the temporary directory. A
        worker that restarts under a living supervisor never removes what its restarted
        siblings bind in."""
        for path in (self.http_socket(self.index), self.fd_socket(self.index)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if self.supervisor and os.getppid() != self.supervisor:
            _remove_abandoned_sockets(self.run_dir)
            with contextlib.suppress(OSError):  # a living sibling's sockets: its to remove
                os.rmdir(self.run_dir)

    def http_socket(self, index: int) -> str:
        """Worker `index`'s Unix socket for HTTP (peer calls, metrics)."""
        return str(Path(self.run_dir) / f"worker-{index}.http")

    def fd_socket(self, index: int) -> str:
        """Worker `index`'s Unix socket handing over chunk file descriptors."""
        return str(Path(self.run_dir) / f"worker-{index}.fds")

    def configure(self, config: Config) -> Config:
        """`config` as this worker runs it: its share of the budget, in ``worker-K`` of
        every cache directory, one of the supervisor's count of workers (not one per CPU
        of its own: what it shares, descriptors included, is split by that count)."""
        cache = replace(
            config.cache,
            dirs=tuple(str(Path(d) / f"worker-{self.index}") for d in config.cache.dirs),
            size=config.cache.size // self.count,
        )
        return replace(config, cache=cache, workers=self.count)


def _remove_abandoned_sockets(directory: str) -> None:
    """Remove the Unix sockets in `directory` that nobody listens on any more (their
    worker was killed, or has closed them as it stops); a connection refused says so, one
    accepted or queued does not."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
        except OSError:
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.setblocking(False)
            try:
                probe.connect(path)
            except ConnectionRefusedError:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            except OSError:  # a full queue (someone listens), or gone already
                pass
