"""A throw-away PostgreSQL server for the test session: ``initdb`` + ``pg_ctl`` in a temp dir.

Real, not mocked. The server listens on 127.0.0.1 on a free port with trust auth, durability
off (fsync) since it dies with the session. PostgreSQL refuses to run as root, so when the
tests run as root the server runs as the ``postgres`` user (``nobody`` failing that), in a
directory of its own outside pytest's root-only temp tree.

If the binaries are missing this raises :class:`PostgresUnavailable` and the fixture
fails: CI must not silently skip the PostgreSQL half of the catalog tests.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

SEARCH_DIRS = "/usr/lib/postgresql/*/bin"
USER = "lota"


class PostgresUnavailable(RuntimeError):
    """PostgreSQL's server binaries are missing or the server would not start."""


def find_bindir() -> Path:
    """The directory holding initdb, pg_ctl and postgres: from PATH, else the newest
    ``/usr/lib/postgresql/*/bin``."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        # pg_ctl finds `postgres` next to its own real path, so follow symlinks.
        return Path(found).resolve().parent
    candidates = sorted(
        glob.glob(SEARCH_DIRS),
        key=lambda d: [int(p) for p in Path(d).parent.name.split(".") if p.isdigit()],
    )
    for bindir in reversed(candidates):
        if all((Path(bindir) / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(bindir)
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in "
        f"{SEARCH_DIRS}; the catalog tests need them: apt-get install postgresql"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_user() -> str | None:
    """Who runs the server: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise PostgresUnavailable("running as root and there is no postgres or nobody user")


class PostgresServer:
    """One running server. Use :meth:`start` and :meth:`stop` (or the fixture)."""

    def __init__(self, root: Path, bindir: Path, port: int, user: str | None) -> None:
        self.root = root
        self.bindir = bindir
        self.port = port
        self.user = user
        self.data = root / "data"
        self.sockets = root / "sock"
        self.log = root / "server.log"

    @classmethod
    def start(cls) -> PostgresServer:
        bindir = find_bindir()
        user = _server_user()
        root = Path(tempfile.mkdtemp(prefix="lota-pg-"))
        server = cls(root, bindir, _free_port(), user)
        try:
            server._init()
            server._start()
        except BaseException:
            server.stop()
            raise
        return server

    def _run(self, *args: str, as_server: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / args[0]), *args[1:]]
        if as_server and self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise PostgresUnavailable(
                f"{' '.join(command)} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}{log}"
            )
        return result

    def _init(self) -> None:
        self.sockets.mkdir()
        if self.user:
            entry = pwd.getpwnam(self.user)
            for path in (self.root, self.sockets):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )

    def _start(self) -> None:
        options = (
            f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            " -c max_connections=300"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self) -> None:
        """Stop the server at once (``-m immediate``) and delete its files."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(PostgresUnavailable, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, *, icu_locale: str | None = "en-US") -> str:
        """Create database `name`; its URL. With `icu_locale` (the default) its default
        collation is ICU's, not byte order, so code that forgets ``COLLATE "C"`` shows."""
        args = ["createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER]
        args += ["--template=template0", "--encoding=UTF8"]
        if icu_locale:
            args += ["--locale-provider=icu", f"--icu-locale={icu_locale}"]
        self._run(*args, name, as_server=False)
        return self.url(name)
