"""Start and stop a real vLLM OpenAI-compatible server (CPU build) as a subprocess on loopback.

Used by `vllm-sentinel demo` and the integration tests: the sentinel is judged against the real
engine's /metrics, never a mock of it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from .tiny_model import MODEL_NAME

# vLLM CPU startup is 45-90 s on 2 cores; leave room for a loaded machine.
DEFAULT_STARTUP_TIMEOUT_S = 600.0  # 40-90 s quiet on 2 cores; seen at 180 s beside other servers
_LOG_TAIL_LINES = 40
_NANOBIND_NOISE = re.compile(r"^( - leaked | - \.\.\. skipped remainder|nanobind: |See https://nanobind)")


class VllmServerError(RuntimeError):
    """The vLLM server could not be started or did not become ready."""


class _PortTaken(Exception):
    """vLLM exited because its port was taken between our check and its bind (retried internally)."""


@dataclass
class VllmServerConfig:
    """Engine settings for one server; each maps to one vLLM command-line flag."""

    model_dir: Path
    served_model_name: str = MODEL_NAME
    # scheduler and cache limits; None leaves vLLM's default
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    num_gpu_blocks_override: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None  # None: vLLM's default
    kv_cache_space_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE: bounds the CPU KV cache
    extra_args: list[str] = field(default_factory=list)  # passed through verbatim, as list items
    extra_env: dict[str, str] = field(default_factory=dict)

    def engine_args(self) -> list[str]:
        """The flags after `--model`, as an argument list (never a shell string)."""
        args = ["--served-model-name", self.served_model_name]
        for flag, value in (
            ("--max-num-seqs", self.max_num_seqs),
            ("--max-model-len", self.max_model_len),
            ("--num-gpu-blocks-override", self.num_gpu_blocks_override),
            ("--max-num-batched-tokens", self.max_num_batched_tokens),
        ):
            if value is not None:
                args += [flag, str(int(value))]
        if self.enable_prefix_caching is True:
            args.append("--enable-prefix-caching")
        elif self.enable_prefix_caching is False:
            args.append("--no-enable-prefix-caching")
        return args + [str(a) for a in self.extra_args]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_in_use(host: str, port: int) -> bool:
    """True when something already accepts TCP connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    """True when GET `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback URL we built
            resp.read()
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    # triton's bindings print hundreds of "nanobind: leaked ..." lines at every exit; they would
    # push the real error out of the tail
    kept = [ln for ln in data.splitlines() if not _NANOBIND_NOISE.match(ln)]
    return "\n".join(kept[-lines:])


class VllmServer:
    """A vLLM API server subprocess in its own process group; use as a context manager or start()/stop()."""

    def __init__(
        self,
        config: VllmServerConfig,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_path: Path | None = None,
        python: str = sys.executable,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.host = host
        self._explicit_port = port is not None
        self.port = port if port is not None else free_port(host)
        self.python = python
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path is not None else Path(
            f"/tmp/vllm-sentinel-server-{os.getuid()}-{self.port}.log"
        )
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:8000 (no trailing slash)."""
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus endpoint the sentinel scrapes."""
        return f"{self.url}/metrics"

    @property
    def instance(self) -> str:
        """The `instance` label Prometheus would give this target (host:port)."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the API server process (the process-group leader), None before start."""
        return self._proc.pid if self._proc is not None else None

    @property
    def model_name(self) -> str:
        """The name clients put in the `model` field."""
        return self.config.served_model_name

    def command(self) -> list[str]:
        """The full argument list used to start the server."""
        return [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.config.model_dir),
            "--host", self.host,
            "--port", str(self.port),
            *self.config.engine_args(),
        ]

    def environment(self) -> dict[str, str]:
        """The child's environment: ours plus the CPU KV-cache bound and any extra variables."""
        env = dict(os.environ)
        env["VLLM_CPU_KVCACHE_SPACE"] = str(self.config.kv_cache_space_gib)
        # vLLM would otherwise try to reach the Hugging Face hub and usage-stats servers
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("VLLM_DO_NOT_TRACK", "1")
        env.update(self.config.extra_env)
        return env

    def is_running(self) -> bool:
        """True while the server process has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> VllmServer:
        """Start the server and block until /health and /metrics answer; raise VllmServerError otherwise."""
        if self._proc is not None:
            raise VllmServerError("server already started; call stop() first")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # a port we picked can be taken by someone else before vLLM binds it: pick again, twice at most
        attempts = 1 if self._explicit_port else 3
        for attempt in range(attempts):
            if _port_in_use(self.host, self.port):
                if self._explicit_port:
                    raise VllmServerError(
                        f"port {self.port} on {self.host} is already in use; stop what listens there "
                        f"or pass another port (or none, to pick a free one)"
                    )
                self.port = free_port(self.host)
            try:
                self._start_once()
                return self
            except _PortTaken:
                if attempt == attempts - 1:
                    raise VllmServerError(
                        f"vLLM could not bind {self.instance}: address already in use; log {self.log_path}"
                    ) from None
                self.port = free_port(self.host)
        raise AssertionError("unreachable")

    def _start_once(self) -> None:
        """One start attempt on self.port; raises _PortTaken when vLLM died on a taken port."""
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(  # noqa: S603 - argument list, no shell
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,  # own process group: stop() reaches EngineCore and workers too
            )
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0

    def _wait_ready(self, t0: float) -> None:
        """Poll /health then /metrics until both answer, the process dies, or the timeout passes."""
        assert self._proc is not None
        deadline = t0 + self.startup_timeout_s
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                if "Address already in use" in log_tail(self.log_path):
                    raise _PortTaken()
                raise VllmServerError(
                    f"vLLM server exited with code {code} during startup "
                    f"(command: {' '.join(self.command())}); log {self.log_path} ends:\n"
                    f"{log_tail(self.log_path)}"
                )
            if _http_ok(f"{self.url}/health") and _http_ok(self.metrics_url):
                return
            time.sleep(0.5)
        raise VllmServerError(
            f"vLLM server on {self.url} not ready after {self.startup_timeout_s:.0f} s "
            f"(raise startup_timeout_s on a slow or busy machine); log {self.log_path} ends:\n"
            f"{log_tail(self.log_path)}"
        )

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the whole process group, SIGKILL what is left after `grace_s`; return the exit code.

        Returns once no process of the group is left (or after a further 10 s), so a caller may
        start the next server at once without two engines sharing the cores.
        """
        proc = self._proc
        if proc is None:
            return None
        pgid = proc.pid  # start_new_session made the server its own group leader
        deadline = time.monotonic() + grace_s
        if proc.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        # EngineCore and workers may outlive the leader for a moment: let them, then sweep the group
        _wait_group_gone(pgid, max(0.0, deadline - time.monotonic()))
        _signal_group(pgid, signal.SIGKILL)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _wait_group_gone(pgid, 10.0)
        self._proc = None
        return proc.returncode

    def restart(self, config: VllmServerConfig) -> VllmServer:
        """Stop the server and start it again with `config`, on the same port when it is still free
        (a sidecar watching host:port keeps recording the same instance)."""
        self.stop()
        self.config = config
        return self.start()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of the server log, for error messages."""
        return log_tail(self.log_path, lines)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to a process group that may already be gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """True while any process of the group exists (a zombie awaiting its reaper counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """Poll until the process group is empty or `timeout_s` passes; True when it is gone."""
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
