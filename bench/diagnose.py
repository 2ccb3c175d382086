"""`diagnose --since 1h` wall time from a fresh process: with the daemon running (API), without (file), and
over an hour a daemon evaluated live (its incidents recorded, nothing left to replay).

Builds 1 h of 1 Hz data for one instance from the real vLLM capture, then times the real CLI.
Prints figures; asserts nothing. Usage: python bench/diagnose.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from store import PAYLOAD, advancing_payloads, tick_batches  # noqa: E402

from vllm_sentinel.agent.alerts.rulepack import load_pack  # noqa: E402
from vllm_sentinel.agent.daemon import client as api  # noqa: E402
from vllm_sentinel.agent.diagnosis.incidents import Evaluator  # noqa: E402
from vllm_sentinel.agent.daemon.paths import socket_path_for  # noqa: E402
from vllm_sentinel.agent.store.db import HOUR_MS, Store  # noqa: E402


def timed_cli(args: list[str], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "vllm_sentinel", *args], capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if res.returncode != 0:
            raise SystemExit(f"diagnose failed: {res.stderr}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "hour.duckdb"
        # a recent hour: the daemon started below applies its 7-day retention to what it opens
        t0 = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS
        payloads = advancing_payloads(PAYLOAD.read_text(), 120)
        with Store.open(db) as store:
            for tick in range(3600):
                store.append_many(tick_batches(payloads[tick % len(payloads)], t0 + tick * 1000, 1))
            store.sort_closed(t0 + 2 * HOUR_MS - 1)
            n = store.con.execute("SELECT count(*) FROM samples").fetchone()[0]
        until = str((t0 + 3600 * 1000) / 1000)
        args = ["diagnose", "--since", "1h", "--until", until, "--db", str(db), "--format", "json"]
        print(f"store: 1 instance, 1 h at 1 Hz, {n:,} samples")
        cold = timed_cli(args, a.repeats)
        print(f"diagnose --since 1h, no daemon (read-only file): median {statistics.median(cold):.2f} s, "
              f"min {min(cold):.2f} s over {a.repeats} fresh processes")
        # a daemon holding the file (its target is a dead port: it only serves the API here)
        daemon = subprocess.Popen([sys.executable, "-m", "vllm_sentinel", "run", "--target", "http://127.0.0.1:9",
                                   "--db", str(db), "--interval", "5s", "--metrics-port", "0"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    api.call(socket_path_for(db), "/v1/health", timeout=1)
                    break
                except api.ApiError:
                    if time.monotonic() > deadline or daemon.poll() is not None:
                        raise SystemExit("daemon did not start")
                    time.sleep(0.2)
            warm = timed_cli(args, a.repeats)
        finally:
            daemon.terminate()
            daemon.wait()
        print(f"diagnose --since 1h, daemon running (unix-socket API): median {statistics.median(warm):.2f} s, "
              f"min {min(warm):.2f} s over {a.repeats} fresh processes")
        # the hour as a daemon watching it live would have left it: the pack evaluated every 5 s as data
        # came, incidents and the covered stretch recorded; diagnose then replays only what it did not cover
        started = time.process_time()
        with Store.open(db) as store:
            evaluator = Evaluator(load_pack(None))
            for tick in range(0, 3601, 5):
                evaluator(store, t0 + tick * 1000)
        live_cpu = time.process_time() - started
        reuse = [*args, "--reuse-live"]
        covered = timed_cli(reuse, a.repeats)
        doc = json.loads(subprocess.run([sys.executable, "-m", "vllm_sentinel", *reuse], capture_output=True,
                                        text=True, check=True).stdout)
        print(f"(live evaluation of the hour, as the daemon does it every 5 s: {live_cpu:.1f} s of CPU in all)")
        print(f"diagnose --since 1h --reuse-live over the hour the daemon evaluated live (no daemon running): median "
              f"{statistics.median(covered):.2f} s, min {min(covered):.2f} s over {a.repeats} fresh processes; "
              f"evaluation {json.dumps(doc.get('evaluation'))}")


if __name__ == "__main__":
    main()
