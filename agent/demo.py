"""`vllm-sentinel demo`: a real vLLM CPU server with a tiny model, real traffic, the sidecar, a diagnosis."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from vllm_sentinel.agent.daemon import DaemonOptions, build_sidecar
from vllm_sentinel.agent.diagnose import diagnose
from vllm_sentinel.agent.store import Store


class DemoError(Exception):
    """The demo could not run; the message says what is missing."""


def run_demo(seconds: int = 60, workdir: Path | None = None, say: Callable[[str], None] = lambda _m: None) -> dict:
    """Start server, sidecar and traffic; after `seconds` of watching, return the diagnose document."""
    try:
        from vllm_sentinel.agent.tiny_model import build_tiny_model
        from vllm_sentinel.agent.traffic import BackgroundTraffic, TrafficPlan
        from vllm_sentinel.agent.vllm_server import VllmServer, VllmServerConfig, VllmServerError
    except ImportError as e:
        raise DemoError(f"the demo needs the server extra ({e.name} missing): pip install 'vllm-sentinel[server]' "
                        "or run `make demo`") from e
    workdir = Path(workdir or Path.cwd() / ".work" / "demo")
    workdir.mkdir(parents=True, exist_ok=True)
    say("building the tiny random-weight Llama (cached after the first run)")
    model_dir = build_tiny_model()
    db = workdir / f"demo-{int(time.time())}.duckdb"
    # two requests at a time and a small KV cache: real queueing and preemption on a laptop CPU
    config = VllmServerConfig(model_dir=model_dir, max_num_seqs=4, max_model_len=512)
    server = VllmServer(config, log_path=workdir / "vllm-server.log")
    say(f"starting a real vLLM CPU server (45-90 s on 2 cores; log {server.log_path})")
    try:
        server.start()
    except VllmServerError as e:
        raise DemoError(str(e)) from e
    try:
        say(f"vLLM ready at {server.url}; starting the sidecar -> {db}")
        sidecar = build_sidecar(DaemonOptions(targets=[server.url], db=db, interval_s=1.0, metrics_port=None))
        start_ms = int(time.time() * 1000)
        sidecar.start()
        try:
            say(f"sending traffic for {seconds}s")
            plan = TrafficPlan(requests=None, duration_s=float(seconds), concurrency=6, prompt_tokens=48,
                               max_tokens=48)
            result = BackgroundTraffic(server.url, server.model_name, plan).start().wait(seconds + 180)
            say(f"traffic done: {result.ok} ok, {result.failed} failed, "
                f"{result.prompt_tokens} prompt + {result.completion_tokens} completion tokens")
            time.sleep(2)  # one more scrape after the last request
        finally:
            sidecar.stop()
            sidecar.store.close()
    finally:
        server.stop()
    end_ms = int(time.time() * 1000)
    with Store.open(db, read_only=True) as store:
        doc = diagnose(store, start_ms, end_ms)
    say(f"recorded {doc['summary'][0]['series'] if doc['summary'] else 0} series; the database stays at {db}")
    return doc
