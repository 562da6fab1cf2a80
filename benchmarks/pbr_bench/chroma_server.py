"""A real ``chroma run`` server for the benchmarks: start, kill, restart, always stopped.

The library's tests start theirs with the same code, in ``tests/chroma_server.py`` (the tests
never import the harness); ``tests/bench/test_bench_separation.py`` checks the two copies stay
the same code.

Pitfalls of ``chroma run`` (measured with chromadb 1.5) this module guards against:

* ``chroma run`` on a port already in use prints "Address ... is not available" and exits 0, so
  a script that only waits for the heartbeat tests against somebody else's server: the port is
  checked free before the start and the process checked alive after the heartbeat.
* Heartbeat is ``/api/v2/heartbeat``; clients use ``127.0.0.1`` (``localhost`` may try ``::1``).
* ``ANONYMIZED_TELEMETRY=False`` in the server's and the clients' settings.

Every server started here is stopped by its process id on every exit path: :meth:`stop` from a
fixture finalizer, and an ``atexit`` hook for anything a crash left running. Only the Chroma
benchmarks import it, so nothing else pays for chromadb.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
HEARTBEAT = "/api/v2/heartbeat"

_RUNNING: dict[int, subprocess.Popen[bytes]] = {}


def _stop_all() -> None:
    for proc in list(_RUNNING.values()):
        _terminate(proc)


atexit.register(_stop_all)


def _terminate(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM (Chroma shuts down cleanly in ~0.2-4 s here), SIGKILL after ``grace_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(5)
    _RUNNING.pop(proc.pid, None)


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM when the process that started it dies, even by SIGKILL
    (the one exit path no finalizer or atexit hook sees). Start servers from the main thread:
    the signal follows the *thread* that forked."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def chroma_executable() -> str:
    """The ``chroma`` CLI of this interpreter's environment (else the one on PATH)."""
    beside = Path(sys.executable).with_name("chroma")
    found = str(beside) if beside.exists() else shutil.which("chroma")
    if not found:
        raise RuntimeError(
            "the `chroma` command was not found; install the extra: "
            "pip install 'personalize-before-retrieve[chroma]'"
        )
    return found


def port_is_served(port: int, host: str = HOST) -> bool:
    """True when something accepts connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port(host: str = HOST) -> int:
    """A port nobody listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def heartbeat(url: str, timeout_s: float = 1.0) -> bool:
    """True when ``url`` answers Chroma's heartbeat with HTTP 200."""
    try:
        with _NO_PROXY.open(url + HEARTBEAT, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class ChromaServer:
    """One ``chroma run`` process over a data folder, on a loopback port.

    Args:
        path: the data folder (created by Chroma); reuse it after :meth:`kill` to test recovery.
        port: default: a free port picked now; :meth:`restart` keeps it, so clients built
            before a restart can be used after it.
        log: where the server's output goes (default ``<path>.log``).
    """

    def __init__(
        self, path: str | os.PathLike[str], port: int | None = None, log: Path | None = None
    ):
        self.path = Path(path)
        self.port = port if port is not None else free_port()
        self.log = log if log is not None else self.path.with_name(self.path.name + ".log")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 60.0, bind_attempts: int = 5) -> ChromaServer:
        """Start the server and wait for its heartbeat; raise with its log if it does not come.

        A server that could not bind its port (right after a restart on the same port, the
        kernel may still hold it) is started again, up to ``bind_attempts`` times.
        """
        if self.alive():
            raise RuntimeError(f"Chroma at {self.url} (pid {self.pid}) is already running")
        for attempt in range(bind_attempts):
            self._wait_port_free()
            proc = self._spawn()
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and not heartbeat(self.url):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"no heartbeat from {self.url} in {timeout_s:.0f} s")
                time.sleep(0.1)
            if proc.poll() is None:
                return self
            _RUNNING.pop(proc.pid, None)
            if "is not available" not in self.log_tail(5) or attempt == bind_attempts - 1:
                break
            time.sleep(1.0)
        # A heartbeat from another process on our port ends here too: our process is gone.
        raise RuntimeError(
            f"chroma run exited with {proc.returncode} instead of serving {self.url}:\n"
            f"{self.log_tail()}"
        )

    def _wait_port_free(self, wait_s: float = 10.0) -> None:
        # `chroma run` on a served port exits 0 without serving: never share a port.
        deadline = time.monotonic() + wait_s
        while port_is_served(self.port):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"port {self.port} already answers: refusing to test against a server this "
                    "test did not start (chroma run would exit 0 without serving)"
                )
            time.sleep(0.1)

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
        command = [chroma_executable(), "run", "--path", str(self.path)]
        command += ["--host", HOST, "--port", str(self.port)]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        _RUNNING[self.proc.pid] = self.proc
        return self.proc

    def stop(self) -> None:
        """Graceful stop by process id (SIGTERM, then SIGKILL)."""
        if self.proc is not None:
            _terminate(self.proc)

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown work, no flush."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc is not None:
            _RUNNING.pop(self.proc.pid, None)

    def restart(self, *, kill: bool = True) -> ChromaServer:
        """Kill (or stop) and start again on the same data folder and port."""
        self.kill() if kill else self.stop()
        return self.start()

    def client(self, **kwargs: Any) -> Any:
        """A ``chromadb.HttpClient`` for this server, telemetry off."""
        import chromadb
        from chromadb.config import Settings

        settings = Settings(anonymized_telemetry=False)
        return chromadb.HttpClient(host=HOST, port=self.port, settings=settings, **kwargs)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> ChromaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
