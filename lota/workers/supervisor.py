"""The supervisor: ``lota serve`` with ``workers`` > 1 starts and keeps the workers.

It binds one listening socket per worker on the listen address (``SO_REUSEPORT``: the
kernel spreads connections over them) and holds them for the node's life, so a worker
that restarts finds its socket, and connections that arrive meanwhile wait in its queue.
Each worker is ``python -m lota serve`` with :data:`lota.workers.spec.VARIABLE` set. A
worker that exits is started again: after 1 s if it ran a minute or more, else after
twice the last wait (2 s the first time), up to 30 s; one that fails at start (status
2, within its first seconds: a cache directory held, a bad setting) stops the node with
status 2, its one line already printed. SIGTERM or SIGINT is passed on to every worker,
which drains; the supervisor waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from lota.cache.files import ChunkFiles, DirLocked, in_use, unusable
from lota.config import Config
from lota.errors import StartupError
from lota.tasks import TaskGroup
from lota.workers.spec import VARIABLE, WorkerSpec

log = logging.getLogger("lota.workers")

# A worker that exits with status 2 this soon after it started failed to start.
START_WINDOW = 10.0
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
# A worker that ran this long before it died starts again at once.
HEALTHY_RUN = 60.0
# Seconds one readiness probe may take (see Supervisor._announce_when_ready).
PROBE_TIMEOUT = 2.0


def listening_sockets(config: Config, count: int) -> list[socket.socket]:
    """`count` sockets listening on ``config.listen`` together (one port, even for 0)."""
    host, port = config.listen_address
    if port and _in_use(host, port):
        raise StartupError(
            f"cannot listen on {config.listen}: address already in use (is another process "
            "on that port? choose one with --listen or LOTA_LISTEN)"
        )
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.listen(1024)
            sock.set_inheritable(True)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise StartupError(f"cannot listen on {config.listen}: {exc.strerror or exc}") from exc
    return sockets


def lock_cache_dirs(config: Config) -> list[int]:
    """Hold each cache directory's lock for the node's life (its workers lock their own
    ``worker-K`` in it): no other ``lota serve`` may use the drive meanwhile, however many
    workers it runs. The descriptors hold the locks; close them at the end."""
    files = ChunkFiles()
    held: list[int] = []
    for root in config.cache.dirs:
        try:
            os.makedirs(root, exist_ok=True)
            held.append(files.lock(root))
        except (DirLocked, OSError) as exc:
            for fd in held:
                os.close(fd)
            message = in_use(root, exc) if isinstance(exc, DirLocked) else unusable(root, exc)
            raise StartupError(message) from exc
    return held


def _in_use(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host or "127.0.0.1", port), 0.5):
        return True
    return False


class Supervisor:
    """Starts `count` workers and keeps them running until told to stop."""

    def __init__(
        self,
        config: Config,
        count: int,
        config_path: str | None,
        overrides: dict[str, Any],
    ) -> None:
        self._config = config
        self._count = count
        self._config_path = config_path
        self._overrides = overrides
        self._stopping = asyncio.Event()
        self._failed: str | None = None
        self._procs: dict[int, asyncio.subprocess.Process] = {}

    async def run(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve until SIGTERM/SIGINT, then drain every worker. :class:`StartupError` if
        a worker cannot start."""
        locks = lock_cache_dirs(self._config)
        try:
            sockets = listening_sockets(self._config, self._count)
        except BaseException:
            for fd in locks:
                os.close(fd)
            raise
        run_dir = tempfile.mkdtemp(prefix="lota-workers-")
        secret = secrets.token_hex(32)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        tasks = TaskGroup("workers")
        try:
            for index, sock in enumerate(sockets):
                spec = WorkerSpec(
                    index=index,
                    count=self._count,
                    listen_fd=sock.fileno(),
                    run_dir=run_dir,
                    secret=secret,
                    supervisor=os.getpid(),
                    config_path=self._config_path,
                    overrides=self._overrides,
                )
                tasks.start(self._keep(spec), f"worker {index}")
            port = sockets[0].getsockname()[1]
            host = self._config.listen_address[0]
            log.info("%d workers serving on %s:%d", self._count, host, port)
            if on_ready is not None:  # beside the wait: a node told to stop before it is
                tasks.start(self._announce_when_ready(host, port, on_ready), "announce")
            await self._stopping.wait()
            await self._stop_all()
        finally:
            await tasks.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            for sock in sockets:
                sock.close()
            for fd in locks:
                os.close(fd)
            shutil.rmtree(run_dir, ignore_errors=True)
        if self._failed:
            raise StartupError(self._failed)

    async def _keep(self, spec: WorkerSpec) -> None:
        """Run worker `spec.index`, again whenever it exits, until the node stops."""
        backoff = FIRST_BACKOFF
        env = {**os.environ, VARIABLE: spec.to_environment()}
        while not self._stopping.is_set():
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "lota", "serve", env=env, pass_fds=(spec.listen_fd,)
            )
            self._procs[spec.index] = proc
            status = await proc.wait()
            if self._stopping.is_set():
                return
            ran = time.monotonic() - started
            if status == 2 and ran < START_WINDOW:
                self._failed = f"worker {spec.index} could not start (see the line above)"
                self._stopping.set()
                return
            backoff = FIRST_BACKOFF if ran > HEALTHY_RUN else min(MAX_BACKOFF, backoff * 2)
            log.warning(
                "worker %d exited with status %s after %.0f s; starting it again in %.0f s",
                spec.index,
                status,
                ran,
                backoff,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), backoff)

    async def _stop_all(self) -> None:
        """SIGTERM to every worker (each drains), then wait; SIGKILL whoever outlasts the
        drain time by far."""
        for proc in self._procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        waits = [proc.wait() for proc in self._procs.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), self._config.drain_timeout + 10)
        except TimeoutError:
            for proc in self._procs.values():
                if proc.returncode is None:
                    proc.kill()
            await asyncio.gather(*(proc.wait() for proc in self._procs.values()))

    async def _announce_when_ready(
        self, host: str, port: int, on_ready: Callable[[str], None]
    ) -> None:
        """`on_ready(url)` once a worker answers ``/_lota/readyz``. Each probe is on a
        connection of its own, given :data:`PROBE_TIMEOUT`: one can land in the queue of a
        worker that has exited (this process holds its socket), where nobody answers."""
        import aiohttp

        scheme = "https" if self._config.tls_cert else "http"
        url = f"{scheme}://{host if ':' not in host else f'[{host}]'}:{port}"
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    async with session.get(
                        f"{url}/_lota/readyz", ssl=False, headers={"Connection": "close"}
                    ) as response:
                        if response.status == 200:
                            on_ready(url)
                            return
                except (aiohttp.ClientError, OSError, TimeoutError):
                    pass
                await asyncio.sleep(0.1)
