"""A real Prometheus (the Debian package's 2.42) on loopback: scraping live targets, or serving backfilled history.

Used by the integration tests and benches that check `diagnose --prometheus` against the real
server, never a mock of its API:

* `PrometheusServer(data_dir, targets=[...]).start()` scrapes vLLM servers like a fleet's would;
* `write_openmetrics(dump, out)` + `backfill(out, data_dir)` load a recorded session (the text dump
  `ingest` reads) with `promtool tsdb create-blocks-from openmetrics`, then `start()` serves it.

Nothing here prints; a failure raises PrometheusServerError with the log's tail.
"""

from __future__ import annotations

import gzip
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vllm_sentinel.agent.demo.vllm_server import free_port, log_tail

STARTUP_TIMEOUT_S = 60.0


class PrometheusServerError(RuntimeError):
    """Prometheus or promtool is missing, or did not do what was asked; the message says why."""


def binary(name: str) -> str:
    """The path of `prometheus` or `promtool`, or PrometheusServerError naming the Debian package."""
    path = shutil.which(name)
    if path is None:
        raise PrometheusServerError(f"{name} not found: install the Debian package `prometheus` (2.42 has both)")
    return path


def _dump_lines(dump: Path) -> Iterator[str]:
    opener = gzip.open if dump.name.endswith(".gz") else open
    with opener(dump, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        yield from f


def openmetrics_lines(lines: Iterable[str]) -> Iterator[str]:
    """A Prometheus text dump with millisecond timestamps as OpenMetrics (seconds, `# EOF`), for promtool.

    'up{instance="a:1"} 1 1796000000123' -> 'up{instance="a:1"} 1 1796000000.123'; comments are dropped.
    """
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        head, value, ts = line.rsplit(" ", 2)
        ms = int(ts)
        yield f"{head} {value} {ms // 1000}.{ms % 1000:03d}\n"
    yield "# EOF\n"


def write_openmetrics(dump: Path, out: Path) -> Path:
    """Convert a text dump (.gz too) with ms timestamps into an OpenMetrics file for backfilling."""
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(openmetrics_lines(_dump_lines(dump)))
    return out


def backfill(openmetrics: Path, data_dir: Path, timeout_s: float = 600.0) -> None:
    """`promtool tsdb create-blocks-from openmetrics FILE DATA_DIR` (before the server starts)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(openmetrics),
                           str(data_dir)], capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise PrometheusServerError(f"promtool could not backfill {openmetrics}: {(done.stderr or done.stdout)[-600:]}")


@dataclass
class PrometheusServer:
    """One Prometheus process on 127.0.0.1, its config and data in `data_dir`."""

    data_dir: Path
    targets: list[str] = field(default_factory=list)  # host:port of vLLM servers to scrape
    scrape_interval: str = "1s"
    scrape_timeout: str = "1s"
    job: str = "vllm"
    web_config: dict | None = None  # Prometheus' --web.config.file (TLS, basic auth)
    rule_files: list[Path] = field(default_factory=list)  # evaluated every 5 s (the config's evaluation_interval)
    extra_flags: list[str] = field(default_factory=list)  # e.g. --web.enable-admin-api for snapshots
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The base URL (https when web_config sets TLS)."""
        scheme = "https" if self.web_config and self.web_config.get("tls_server_config") else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """Where the server logs."""
        return self.data_dir / "prometheus.log"

    def _config(self) -> Path:
        scrape = [{"job_name": self.job, "scrape_interval": self.scrape_interval,
                   "scrape_timeout": self.scrape_timeout, "static_configs": [{"targets": list(self.targets)}]}]
        cfg = {"global": {"scrape_interval": self.scrape_interval, "evaluation_interval": "5s"},
               "scrape_configs": scrape if self.targets else []}
        if self.rule_files:
            cfg["rule_files"] = [str(p) for p in self.rule_files]
        path = self.data_dir / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        return path

    def start(self) -> PrometheusServer:
        """Start it and wait until /-/ready answers (its blocks are loaded by then)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        cmd = [binary("prometheus"), f"--config.file={self._config()}", f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
               f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=100y",
               "--log.level=warn", *self.extra_flags]
        if self.web_config is not None:
            web = self.data_dir / "web.yml"
            web.write_text(yaml.safe_dump(self.web_config), encoding="utf-8")
            cmd.append(f"--web.config.file={web}")
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process' lifetime
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise PrometheusServerError(f"prometheus exited ({self.proc.returncode}): {log_tail(self.log_path)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or TLS/auth in front of it: the port answering at all is enough
            else:
                continue
            if self.web_config is not None and _listening(self.port):
                return
            time.sleep(0.2)
        self.stop()
        raise PrometheusServerError(f"prometheus not ready in {STARTUP_TIMEOUT_S:.0f} s: {log_tail(self.log_path)}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0
