"""The daemon's CPU budget: the accountant on a fake clock and CPU readers, the sidecar's interval
stretch, and `run --cpu-budget` end to end (a bad value refused; a tiny budget defers reports and says so)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.agent.daemon.test_sidecar import DOWN_RULE, cli, start_daemon, wait_status
from vllm_sentinel.agent.daemon.cpu_budget import CpuBudget, host_cpu_jiffies, parse_budget, self_cpu_seconds
from vllm_sentinel.agent.daemon.sidecar import Sidecar, SidecarConfig
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.base import Batch


class Machine:
    """A fake clock, daemon CPU and host jiffies that a test advances by hand."""

    def __init__(self) -> None:
        self.t = 0.0
        self.cpu = 0.0
        self.busy = 0.0
        self.total = 0.0

    def run(self, seconds: float, daemon_share: float, host_busy: float, cores: int = 2) -> None:
        """Let `seconds` pass with the daemon using `daemon_share` of one core and the host `host_busy` of all."""
        self.t += seconds
        self.cpu += seconds * daemon_share
        self.total += seconds * 100 * cores
        self.busy += seconds * 100 * cores * host_busy

    def budget(self, budget: float = 0.05, interval_s: float = 1.0, **kw) -> CpuBudget:
        return CpuBudget(budget, interval_s, clock=lambda: self.t, read_self=lambda: self.cpu,
                         read_host=lambda: (self.busy, self.total), **kw)


def tick(m: Machine, b: CpuBudget, seconds: int, daemon_share: float, host_busy: float) -> None:
    for _ in range(seconds):
        m.run(1, daemon_share, host_busy)
        b.sample()


def test_under_budget_optional_work_runs_and_nothing_is_stretched():
    m = Machine()
    b = m.budget()
    tick(m, b, 60, daemon_share=0.03, host_busy=0.99)  # a saturated host, but the daemon keeps its budget
    assert b.used() == pytest.approx(0.03)
    assert b.allow("capture") and b.allow("report")
    assert b.interval_s() == 1.0
    assert b.deferred == {"capture": 0, "profiler": 0, "report": 0}


def test_over_budget_defers_work_counting_each_item_once():
    m = Machine()
    b = m.budget()
    counted: list[str] = []
    b.on_defer = counted.append
    tick(m, b, 40, daemon_share=0.20, host_busy=0.30)  # over budget on an idle host
    assert not b.allow("capture")
    assert not b.allow("report")
    assert not b.allow("report", retry=True)  # the same report asking again is not a second deferral
    assert b.deferred == {"capture": 1, "profiler": 0, "report": 1} and counted == ["capture", "report"]
    assert b.interval_s() == 1.0  # the host has room: scraping keeps its resolution
    summary = b.status()["summary"]
    assert "cpu 20.0% of one core, budget 5%" in summary and "1 capture deferred" in summary
    assert "--cpu-budget to 25%" in summary  # the fix, when scraping alone is above the budget


def test_the_window_forgets_a_burst_so_deferred_work_runs_again():
    m = Machine()
    b = m.budget(window_s=30)
    tick(m, b, 5, daemon_share=0.02, host_busy=0.5)
    m.run(1, daemon_share=3.0, host_busy=0.5)  # a report with charts: 3 s of CPU in one second
    b.sample()
    assert not b.allow("report")
    tick(m, b, 40, daemon_share=0.02, host_busy=0.5)  # the burst has left the 30 s window
    assert b.used() == pytest.approx(0.02)
    assert b.allow("report", retry=True)


def test_over_budget_on_a_saturated_host_stretches_the_interval_step_by_step_and_back():
    m = Machine()
    b = m.budget(budget=0.05, interval_s=1.0, window_s=30)
    seen = []
    for _ in range(120):
        m.run(1, daemon_share=0.30, host_busy=0.97)
        seen.append(b.sample())
    # doubled at most once per hold period (a third of the window), capped at 8x
    assert seen[0] == 1.0 and 2.0 in seen and 4.0 in seen and seen[-1] == 8.0
    assert all(later <= 2 * earlier for earlier, later in zip(seen, seen[1:]))
    assert "interval stretched 1s -> 8s (host 97% busy)" in b.status()["summary"]
    for _ in range(120):  # vLLM goes quiet: the host has room again
        m.run(1, daemon_share=0.30, host_busy=0.20)
        seen.append(b.sample())
    assert seen[-1] == 1.0 and 2.0 in seen[120:]


def test_the_run_summary_says_how_far_it_stretched_what_waited_and_the_budget_that_avoids_it():
    m = Machine()
    b = m.budget(budget=0.05, interval_s=1.0, window_s=30)
    assert CpuBudget.run_summary(b.status()) == ""  # nothing happened: nothing to say
    tick(m, b, 120, daemon_share=0.30, host_busy=0.97)
    assert not b.allow("report")
    tick(m, b, 120, daemon_share=0.01, host_busy=0.20)  # back to the configured interval by the end
    doc = b.status()
    assert doc["effective_interval_s"] == 1.0 and doc["widest_interval_s"] == 8.0
    line = CpuBudget.run_summary(doc)
    assert "collection stretched from every 1s to every 8s at most" in line
    assert "deferred 1 report" in line
    # it used 30 % of a core: a budget a quarter above that keeps it under
    assert "--cpu-budget 38% would have avoided it" in line, line
    # over budget on a host with room: reports wait, nothing stretches, and no saturated host is claimed
    quiet = m.budget(budget=0.05, interval_s=1.0, window_s=30)
    tick(m, quiet, 60, daemon_share=0.30, host_busy=0.20)
    assert not quiet.allow("report")
    line = CpuBudget.run_summary(quiet.status())
    assert "deferred 1 report" in line and "stretched" not in line and "saturated" not in line, line


def test_no_host_figures_never_stretch():
    m = Machine()
    b = CpuBudget(0.05, 1.0, clock=lambda: m.t, read_self=lambda: m.cpu, read_host=lambda: None)
    tick(m, b, 60, daemon_share=0.5, host_busy=1.0)
    assert b.host_busy() == 0.0 and b.interval_s() == 1.0


def test_the_daemons_cpu_counts_its_chart_processes_but_not_other_children(tmp_path):
    # a report's charts are drawn in a child: still the daemon's work on vLLM's host
    from tests.reports.report_goldens import load_fixture
    from vllm_sentinel.reports.chart_process import child_cpu_seconds, draw_in_child
    from vllm_sentinel.reports.write import plan_charts

    before, charts_before = self_cpu_seconds(), child_cpu_seconds()
    drawn = draw_in_child(plan_charts(load_fixture("kv_cache_pressure")), tmp_path)
    assert drawn and child_cpu_seconds() > charts_before
    assert self_cpu_seconds() - before >= child_cpu_seconds() - charts_before
    # the demo runs vLLM as a child of the daemon's process: a restarted server's CPU is not the daemon's
    before = self_cpu_seconds()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass"
    subprocess.run([sys.executable, "-c", burn], check=True, timeout=120)
    assert self_cpu_seconds() - before < 0.5


def test_proc_stat_is_read_as_busy_and_total(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 1 2 3 4 5 6 7 8\n")
    assert host_cpu_jiffies(stat) == (160.0, 1000.0)  # idle and iowait are not busy
    assert host_cpu_jiffies(tmp_path / "absent") is None


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.05", 0.05), ("100%", 1.0), (" 2.5% ", 0.025)])
def test_budget_values(text, value):
    assert parse_budget(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["0", "5", "150%", "-1%", "nan", "lots", "", "inf"])
def test_bad_budget_values_are_refused_naming_the_fix(text):
    with pytest.raises(ValueError, match=r"--cpu-budget .*e\.g\. --cpu-budget 5%"):
        parse_budget(text)


def test_run_refuses_a_bad_cpu_budget_in_one_line(tmp_path):
    res = cli("run", "--target", "http://127.0.0.1:9", "--db", str(tmp_path / "s.duckdb"), "--metrics-port", "0",
              "--cpu-budget", "500%", "--duration", "1s")
    assert res.returncode != 0
    assert "Traceback" not in res.stderr and "--cpu-budget '500%'" in res.stderr and "5%" in res.stderr
    assert not (tmp_path / "s.duckdb").exists()  # refused before anything started


class Ticker:
    name = "ticker"

    def collect(self, now_ms: int) -> Batch:
        batch = Batch(instance="fake:1", ts_ms=now_ms)
        batch.add("up", "", 1.0)
        return batch


def test_the_sidecar_reschedules_its_collectors_when_the_budget_stretches(tmp_path, caplog):
    caplog.set_level("INFO", logger="vllm_sentinel")
    m = Machine()
    budget = m.budget(interval_s=0.5, window_s=3)  # every sample: 10 s of a daemon at 50 % on a host at 99 %

    def advance() -> float:
        m.run(10, daemon_share=0.5, host_busy=0.99)
        return m.t

    budget.clock = advance
    with Store.open(tmp_path / "b.duckdb") as store:
        sidecar = Sidecar(store, [Ticker()], SidecarConfig(interval_s=0.5, metrics_port=None, cpu_budget=budget))
        sidecar.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and budget.interval_s() < 4.0:
                time.sleep(0.2)
            time.sleep(1.5)  # one more budget job run after the last stretch
            interval = sidecar._scheduler.every("ticker")
        finally:
            sidecar.stop()
    assert budget.interval_s() == 4.0  # 0.5 s stretched to its 8x cap
    assert interval == 4.0
    # three steps (1 s, 2 s, 4 s): the first one warned, the later ones only repeat it
    said = [r for r in caplog.records if r.getMessage().startswith("cpu budget: collecting every")]
    assert [r.levelname for r in said] == ["WARNING", "INFO", "INFO"], [(r.levelname, r.getMessage()) for r in said]


def test_a_daemon_over_its_budget_defers_reports_and_says_so(tmp_path):
    rules = tmp_path / "down.yaml"
    rules.write_text(DOWN_RULE)
    db = tmp_path / "s.duckdb"
    port = _free_port()
    proc = start_daemon(db, "http://127.0.0.1:9", extra=("--eval-interval", "1s", "--rules", str(rules),
                                                          "--cpu-budget", "0.01%", "--metrics-port", str(port)))
    try:
        doc = wait_status(db, lambda d: d["cpu"]["deferred"]["report"] >= 1, timeout=60)
        assert doc["reports"] == []  # held back, not written
        assert "1 report deferred" in doc["cpu"]["summary"] or "reports deferred" in doc["cpu"]["summary"]
        assert doc["cpu"]["budget"] == pytest.approx(0.0001)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'vllm_sentinel_deferred_total{work="report"} 1.0' in text
        assert "vllm_sentinel_cpu_budget_ratio 0.0001" in text
        assert "vllm_sentinel_effective_interval_seconds" in text
        res = cli("status", "--db", str(db), "--format", "json")
        assert res.returncode == 0 and json.loads(res.stdout)["cpu"]["deferred"]["report"] >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_measure_with_counts_only_what_the_new_reader_says():
    """A process that also runs other work (the demo's load) swaps in a reader of the daemon's part only."""
    m = Machine()
    b = m.budget(budget=0.05, interval_s=1.0, window_s=30)
    tick(m, b, 20, daemon_share=0.50, host_busy=0.97)
    assert b.used() > 0.05
    own = [0.0]
    b.measure_with(lambda: own[0])
    for _ in range(20):
        m.run(1, daemon_share=0.50, host_busy=0.97)  # the process still burns half a core...
        own[0] += 0.02  # ...of which the daemon's own is 2 %
        b.sample()
    assert b.used() == pytest.approx(0.02) and b.interval_s() == 1.0
