"""A throwaway PostgreSQL server on a loopback port, for the multi-host tests and the scale benchmark.

Several hosts sharing one study is Optuna's shared-database pattern, and only a real server shows its
races (row locks, serialisation, connection limits), so the tests start one instead of mocking it.
PostgreSQL refuses to run as root: as root, `initdb` and `pg_ctl` run as the `postgres` user
(`runuser -u postgres --`) in a folder that user owns; as anyone else, as that user. Nothing here
touches a system cluster: the data folder is a fresh temporary one and is removed on stop.

    >>> with ThrowawayPostgres() as pg:                                        # doctest: +SKIP
    ...     url = pg.create_database("study")    # postgresql+psycopg://autotune@127.0.0.1:PORT/study
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from autotune.engine.process import find_free_port

USER = "autotune"


def find_bindir() -> Path | None:
    """The newest /usr/lib/postgresql/N/bin holding initdb and pg_ctl (Debian's layout), else None."""
    found = []
    for d in Path("/usr/lib/postgresql").glob("*/bin"):
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file() and d.parent.name.isdigit():
            found.append((int(d.parent.name), d))
    return max(found)[1] if found else None


class ThrowawayPostgres:
    def __init__(self, bindir: Path | None = None, max_connections: int = 300) -> None:
        self.bindir = bindir or find_bindir()
        if self.bindir is None:
            raise RuntimeError("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin "
                               "(apt-get install postgresql)")
        self.max_connections = max_connections
        self.root: Path | None = None
        self.port = 0
        self.pid: int | None = None
        self.pids: list[int] = []       # every postmaster started (restarts included)

    def _as_owner(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        cmd = ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv
        return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120, **kw)

    def start(self) -> "ThrowawayPostgres":
        self.root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        data, sock = self.root / "data", self.root / "sock"
        self._as_owner(["mkdir", str(sock)])
        self._as_owner([str(self.bindir / "initdb"), "-D", str(data), "-U", USER, "-A", "trust", "-E", "UTF8",
                        "--no-sync", "--no-instructions"])
        self.port = find_free_port()
        self.start_server()
        return self

    def start_server(self) -> None:
        """Start the server on this object's data folder and port (again, after `stop_server`)."""
        assert self.root is not None, "start() first"
        data, sock = self.root / "data", self.root / "sock"
        # fsync off: a test server has nothing to keep; every value below is ours, not user text
        opts = (f"-p {self.port} -h 127.0.0.1 -k {sock} -F -c max_connections={self.max_connections} "
                f"-c shared_buffers=16MB")
        self._as_owner([str(self.bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(self.root / "server.log"),
                        "-w", "-t", "60", "start"])
        self.pid = int((data / "postmaster.pid").read_text().split()[0])
        self.pids.append(self.pid)

    def stop_server(self) -> None:
        """Fast shutdown (clients are cut off, as when a database host restarts), keeping the data folder
        and the port for `start_server`; makes sure by PID that no server process is left."""
        if self.root is None or self.pid is None:
            return
        if psutil.pid_exists(self.pid):
            try:
                self._as_owner([str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "fast", "-w",
                                "-t", "30", "stop"])
            except subprocess.SubprocessError:
                pass
            self._kill_if_left()
        self.pid = None

    def restart(self, down_s: float = 0.0) -> None:
        """Stop, stay down `down_s` seconds, start again on the same port and data folder."""
        self.stop_server()
        time.sleep(down_s)
        self.start_server()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A fresh database on this server (so each test starts empty); its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """Fast shutdown, then make sure by PID that no server process is left, then remove the folder."""
        if self.root is None:
            return
        self.stop_server()
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def _kill_if_left(self) -> None:
        assert self.pid is not None
        try:
            proc = psutil.Process(self.pid)
            family = [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for p in family:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(family, timeout=10)

    def alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def __enter__(self) -> "ThrowawayPostgres":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

