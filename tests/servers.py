"""Real servers for the tests: a private PostgreSQL cluster and an MLflow tracking server.

    with postgres_cluster() as pg, mlflow_server(pg.url("mlflow"), artifacts) as tracking_uri:
        ...

Both listen on 127.0.0.1 only, on free ports, with their files in a temporary folder, and
are stopped (and the folder removed) afterwards. The cluster's superuser has a password, so
that the tests can check that no password leaks into logs, params or tags.

Where a binary is missing (`initdb`, `pg_ctl`, `mlflow`) or the PostgreSQL driver is not
installed, `require_servers()` skips the test with a reason naming it; with
HMER_REQUIRE_SERVERS=1 (set by .ci/run) it fails instead, so CI cannot pass without them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

PG_USER = "hmer"
PG_PASSWORD = "s3cret-pw"  # the tests check that this never shows up anywhere


def _pg_binary(name: str) -> str | None:
    """`name` on PATH, else in Debian's /usr/lib/postgresql/<version>/bin (newest version)."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return candidates[-1] if candidates else None


def _mlflow_binary() -> str | None:
    beside = Path(sys.executable).parent / "mlflow"  # the venv running the tests
    return str(beside) if beside.is_file() else shutil.which("mlflow")


def require_servers() -> None:
    """Skip (or, with HMER_REQUIRE_SERVERS=1, fail) unless everything the servers need is here."""
    missing = [name for name in ("initdb", "pg_ctl", "createdb") if _pg_binary(name) is None]
    if _mlflow_binary() is None:
        missing.append("mlflow")
    try:
        import psycopg  # noqa: F401 - SQLAlchemy 2.1's driver of postgresql:// URLs
    except ImportError:
        missing.append("the psycopg module (pip install 'psycopg[binary]')")
    if not missing:
        return
    reason = (f"{', '.join(missing)} not found (PostgreSQL: apt-get install -y postgresql; "
              f"searched PATH and /usr/lib/postgresql/*/bin)")
    if os.environ.get("HMER_REQUIRE_SERVERS") == "1":
        pytest.fail(f"HMER_REQUIRE_SERVERS=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PostgresCluster:
    """A running private cluster; `url(db)` is a SQLAlchemy URL with the password in it."""

    folder: Path
    port: int
    as_user: list[str]  # `runuser -u postgres --` when the tests run as root (initdb refuses root)
    pg_ctl: str

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    def url(self, database: str, password: str | None = PG_PASSWORD) -> str:
        auth = f"{PG_USER}:{password}" if password is not None else PG_USER
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        """`createdb`, as docs/studies.md has users run it."""
        subprocess.run([_pg_binary("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER, name],
                       env={**os.environ, "PGPASSWORD": PG_PASSWORD}, check=True, capture_output=True, text=True)

    def start(self) -> None:
        subprocess.run([*self.as_user, self.pg_ctl, "start", "-w", "-t", "60", "-D", str(self.data_dir),
                        "-l", str(self.folder / "postgres.log"),
                        "-o", f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder}"],
                       check=True, capture_output=True, text=True)

    def stop(self, mode: str = "fast") -> None:
        """`fast` disconnects every client and shuts down cleanly, as a database restart does."""
        subprocess.run([*self.as_user, self.pg_ctl, "stop", "-w", "-m", mode, "-D", str(self.data_dir)],
                       check=True, capture_output=True, text=True)

    def log(self) -> str:
        path = self.folder / "postgres.log"
        return path.read_text(errors="replace") if path.is_file() else ""


@contextlib.contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    """initdb + pg_ctl start in a fresh temporary folder; stopped and removed afterwards."""
    require_servers()
    initdb, pg_ctl = _pg_binary("initdb"), _pg_binary("pg_ctl")
    assert initdb and pg_ctl
    folder = Path(tempfile.mkdtemp(prefix="hmer-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    pwfile = folder / "pw"
    pwfile.write_text(PG_PASSWORD + "\n")
    if as_user:
        shutil.chown(pwfile, "postgres", "postgres")
    try:
        subprocess.run([*as_user, initdb, "-D", str(folder / "data"), "-U", PG_USER, f"--pwfile={pwfile}",
                        "--auth=scram-sha-256", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True, text=True)
        pwfile.unlink()
        cluster = PostgresCluster(folder=folder, port=free_port(), as_user=as_user, pg_ctl=pg_ctl)
        cluster.start()
        try:
            yield cluster
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                cluster.stop("immediate")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def mlflow_server(backend_store_uri: str, artifacts: Path, timeout_s: float = 600.0) -> Iterator[str]:
    """`mlflow server` on 127.0.0.1 with `backend_store_uri` and artifacts proxied into `artifacts`;
    yields its http:// URI. Its output goes to artifacts/../mlflow-server.log."""
    require_servers()
    port = free_port()
    log_path = artifacts.parent / "mlflow-server.log"
    artifacts.mkdir(parents=True, exist_ok=True)
    cmd = [_mlflow_binary(), "server", "--backend-store-uri", backend_store_uri,
           "--artifacts-destination", str(artifacts), "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    uri = f"http://127.0.0.1:{port}"
    # the server and its uvicorn/gunicorn workers may take a while to stop
    with http_server(cmd, f"{uri}/health", log_path, start_timeout_s=timeout_s, stop_timeout_s=20):
        yield uri


@contextlib.contextmanager
def http_server(cmd: list[str], url: str, log_path: Path, *, cwd: Path | None = None, start_timeout_s: float,
                stop_timeout_s: float) -> Iterator[str]:
    """Start `cmd` in its own process group, its output in `log_path`; wait until `url` answers 200
    and yield it; then stop the group (SIGTERM, SIGKILL after `stop_timeout_s`). A server that exits
    or does not answer within `start_timeout_s` raises with the end of its log."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{Path(cmd[0]).name} did not start (status {proc.poll()}):\n"
                                   + log_path.read_text(errors="replace")[-3000:])
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
