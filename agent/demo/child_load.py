"""A traffic scenario's load sent from a child process, so its clients share no interpreter with the sidecar.

In one process, 12-32 client threads and the sidecar contend for one GIL: the clients' latency ran 1.6-2.7 s
over vLLM's own e2e after restarts, and the demo's CPU budget had to leave their threads out. From a child
process the clients are what a user's clients are: another program on the host.

    python -m vllm_sentinel.agent.demo.child_load URL MODEL SCENARIO SECONDS   (prints what its clients saw, JSON)
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Callable

from vllm_sentinel.agent.demo import scenarios
from vllm_sentinel.agent.demo.traffic import BackgroundTraffic, TrafficPlan, TrafficResult
from vllm_sentinel.agent.demo.vllm_server import VllmServer

# the traffic-only scenarios, by name: (the incident each must produce, its plan for a hold in seconds)
PLANS: dict[str, tuple[str | None, Callable[[float], TrafficPlan]]] = {
    "healthy": (None, scenarios.healthy_plan),
    "queue_blocking": ("queue_blocking", scenarios.queue_plan),
    "kv_cache_pressure": ("kv_cache_pressure", scenarios.kv_pressure_plan),
}
SLACK_S = 300  # past the hold: the last requests' own timeouts, and a starved child's start


def run_in_child(name: str, server: VllmServer, seconds: float | None = None,
                 say: Callable[[str], None] = lambda _m: None) -> scenarios.ScenarioRun:
    """Scenario `name` (a key of PLANS) on `server`, its clients in a child process; the same run record,
    phases and settling as the in-process scenario. ScenarioError when the server is down or the child fails."""
    if not server.is_running():
        raise scenarios.ScenarioError(f"the vLLM server at {server.url} is not running; start it before {name}")
    expected, plan_for = PLANS[name]
    hold = seconds or scenarios.DEFAULT_HOLD_S[name]
    plan = plan_for(hold)
    run = scenarios.ScenarioRun(name, expected, int(time.time() * 1000))
    run.mark("load")
    say(f"{name}: {plan.concurrency} clients, {plan.prompt_tokens}+{plan.max_tokens} tokens, {hold:.0f} s")
    argv = [sys.executable, "-m", "vllm_sentinel.agent.demo.child_load", server.url, server.model_name, name, str(hold)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=hold + SLACK_S, check=True)
        run.traffic = TrafficResult(**json.loads(done.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError, TypeError) as e:
        detail = getattr(e, "stderr", "") or ""
        raise scenarios.ScenarioError(f"{name}: the load's child process failed ({e}); "
                                      f"its last words: {detail.strip()[-300:] or 'none'}") from e
    run.mark("settle")
    time.sleep(scenarios.SETTLE_S)
    run.end_ms = int(time.time() * 1000)
    return run


def main(argv: list[str]) -> int:
    """The child: run one scenario's plan against URL and print what its clients saw as one line of JSON."""
    url, model, name, hold = argv[0], argv[1], argv[2], float(argv[3])
    plan = PLANS[name][1](hold)
    result = BackgroundTraffic(url, model, plan).start().wait(hold + plan.request_timeout_s + 30)
    print(json.dumps(dataclasses.asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
