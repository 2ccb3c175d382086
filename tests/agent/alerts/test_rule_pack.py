"""The shipped rule pack: every incident of the vocabulary, evidence and fixes on every rule,
threshold parameters, and GPU rules on the real H200 recording (tests/collectors/fixtures/nvml)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml

from vllm_sentinel.agent.diagnosis.fixes import FIXES
from vllm_sentinel.agent.diagnosis.incidents import evaluate_window
from vllm_sentinel.agent.store.ingest import ingest_file
from vllm_sentinel.agent.alerts.rulefile import load_rule_files, parse_rule_text, rule_test_path
from vllm_sentinel.agent.alerts.rulemodel import RuleFileError
from vllm_sentinel.agent.alerts.rulepack import load_pack, packaged_rules_dir
from vllm_sentinel.agent.alerts.export import export_rules
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.base import Batch

# the canonical incident ids
VOCABULARY = {"queue_blocking", "prefill_hol_blocking", "kv_cache_pressure", "kv_fragmentation", "oom_risk",
              "bandwidth_bound_decode", "underbatched", "ttft_slo_breach", "tpot_slo_breach", "traffic_burst",
              "frontend_cpu_bound", "engine_stall", "gpu_fault", "target_down", "load_imbalance",
              "prefix_cache_ineffective"}
NVML_DUMP = Path(__file__).parents[2] / "collectors" / "fixtures" / "nvml" / "nvml-h200.prom.gz"


def alerts(files=None):
    return [r for f in (files or load_pack()) for r in f.rules if r.is_alert]


def test_the_pack_covers_every_incident_of_the_vocabulary() -> None:
    assert {r.incident for r in alerts()} == VOCABULARY


def test_every_rule_is_documented_with_evidence_and_a_fix() -> None:
    for r in alerts():
        assert r.severity in {"critical", "high", "warning", "info"}, r.name
        assert r.description and r.references, f"{r.name}: description and references"
        assert "{{ $labels.instance }}" in r.annotations["summary"], f"{r.name}: summary names the instance"
        assert r.evidence and all(e.unit for e in r.evidence), f"{r.name}: evidence with units"
        assert r.fix, f"{r.name}: at least one fix"
        for f in r.fix:
            assert f.compute or f.suggest, f"{r.name}: fix {f.param} computes or suggests a value"
            assert f.compute is None or f.compute in FIXES, f"{r.name}: {f.compute} not registered"
        assert "${" not in r.expr + json.dumps(r.annotations), f"{r.name}: unsubstituted parameter"


def test_every_rule_file_has_its_test_file() -> None:
    for path in sorted(packaged_rules_dir().glob("*.yaml")):
        assert rule_test_path(path).is_file(), path


def test_slo_thresholds_default_to_the_design_values() -> None:
    by_name = {r.name: r for r in alerts()}
    assert by_name["VllmTtftSloBreach"].expr.rstrip().endswith("> 2")
    assert by_name["VllmTpotSloBreach"].expr.rstrip().endswith("> 0.1")
    assert "2s objective" in by_name["VllmTtftSloBreach"].annotations["summary"]


def test_a_params_file_overrides_thresholds_everywhere(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("ttft_slo_seconds: 1.5\nslo_for: 5m\n")
    ttft = next(r for r in alerts(load_pack(None, params)) if r.name == "VllmTtftSloBreach")
    assert ttft.expr.rstrip().endswith("> 1.5")
    assert ttft.for_ms == 300_000
    assert "1.5s objective" in ttft.annotations["summary"]
    assert next(e for e in ttft.evidence if e.signal == "ttft_p95_seconds").threshold == 1.5
    assert next(e for e in ttft.evidence if e.signal == "ttft_slo_seconds").expr == "vector(1.5)"


def test_an_unknown_parameter_name_is_an_error_naming_the_file_and_the_allowed_names(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("ttft_slo_secs: 1.5\n")
    with pytest.raises(RuleFileError) as e:
        load_pack(None, params)
    msg = str(e.value)
    assert str(params) in msg and "ttft_slo_secs" in msg and "ttft_slo_seconds" in msg


def test_a_bad_parameter_value_or_reference_is_an_error_with_file_and_line(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("ttft_slo_seconds: '2 or vector(1)'\n")
    with pytest.raises(RuleFileError, match="params.yaml: parameter 'ttft_slo_seconds'"):
        load_pack(None, params)
    text = "params: {a: 1}\ngroups:\n- name: g\n  rules:\n  - alert: X\n    expr: up > ${b}\n"
    with pytest.raises(RuleFileError, match=r"f.yaml:6:\d+: unknown parameter \$\{b\}; declared in params: a"):
        parse_rule_text(text, "f.yaml")


def test_export_writes_the_substituted_values(tmp_path: Path) -> None:
    rules = sorted(packaged_rules_dir().glob("*.yaml"))
    result = export_rules(rules, [], tmp_path, {"ttft_slo_seconds": 3})
    for p in result.rule_files:
        text = p.read_text()
        assert "${" not in text and "params" not in yaml.safe_load(text)
    slo = yaml.safe_load((tmp_path / "latency-slo.yaml").read_text())
    ttft = next(r for g in slo["groups"] for r in g["rules"] if r["alert"] == "VllmTtftSloBreach")
    assert ttft["expr"].rstrip().endswith("> 3")


def test_overrides_only_reach_the_files_that_declare_them() -> None:
    files = load_rule_files([packaged_rules_dir()], {"down_for": "1m"})
    down = next(r for r in alerts(files) if r.name == "VllmTargetDown")
    assert down.for_ms == 60_000
    assert all("down_for" not in f.params for f in files if not f.path.endswith("availability.yaml"))


# -- GPU rules on the real H200 recording ---------------------------------------------------------
INSTANCE = "h200:8000"


def _phases() -> dict[str, list[int]]:
    with gzip.open(NVML_DUMP, "rt") as f:
        header = f.readline()
    return json.loads(header.split("load phases (epoch ms): ", 1)[1])


def _decode_heavy_vllm(store: Store, start_ms: int, end_ms: int) -> None:
    """vLLM counters for the same instance: 300 generated and 50 prompt tokens per second."""
    batches = []
    for i, t in enumerate(range(start_ms, end_ms + 1, 1000)):
        b = Batch(instance=INSTANCE, ts_ms=t)
        labels = {"engine": "0", "model_name": "m"}
        b.add("vllm:generation_tokens_total", labels, 300.0 * i)
        b.add("vllm:prompt_tokens_total", labels, 50.0 * i)
        b.add("vllm:num_requests_running", labels, 8.0)
        b.add("up", "", 1.0)
        batches.append(b)
    store.append_many(batches)


@pytest.fixture(scope="module")
def h200_store():
    store = Store.open(":memory:")
    ingest_file(store, NVML_DUMP, instance=INSTANCE)
    ph = _phases()
    _decode_heavy_vllm(store, ph["idle"][0] - 60_000, ph["tail"][1])
    yield store, ph
    store.close()


# the recording's phases last 20 s, so the GPU window and `for` are shortened through params,
# as an operator would for a short benchmark
SHORT = {"bw_window": "5s", "bw_for": "5s"}


def h200_incidents(store: Store, start_ms: int, end_ms: int, incident: str | None = None) -> list[dict]:
    """The pack's incidents (SHORT params) over the H200 recording's window, or only those of one kind."""
    found = evaluate_window(store, start_ms, end_ms, INSTANCE, load_pack(None, SHORT), step_ms=1000)
    return [i for i in found if incident is None or i["incident"] == incident]


def test_bandwidth_bound_decode_fires_in_the_memory_bound_phase_of_the_h200_recording(h200_store) -> None:
    store, ph = h200_store
    found = h200_incidents(store, *ph["memory_bound"], "bandwidth_bound_decode")
    assert found, "bandwidth_bound_decode must fire while the H200 copies memory"
    inc = found[0]
    assert inc["instance"] == INSTANCE and inc["labels"]["model_name"] == "m"
    ev = {e["signal"]: e["value"] for e in inc["evidence"]}
    assert ev["dram_active"] > 0.8 and ev["tensor_active"] < 0.1
    assert ev["decode_token_share"] == pytest.approx(300 / 350)


def test_bandwidth_bound_decode_does_not_fire_in_the_compute_bound_phase(h200_store) -> None:
    store, ph = h200_store
    comp_start, comp_end = ph["compute_bound"]
    found = h200_incidents(store, comp_start, comp_end, "bandwidth_bound_decode")
    # the memory-bound episode may still be resolving at the window's start; none may start inside it
    starts = [i["start"] for i in found]
    assert all(s < _iso(comp_start) for s in starts), starts


def test_the_healthy_h200_recording_raises_no_gpu_fault_or_oom_risk(h200_store) -> None:
    store, ph = h200_store
    found = h200_incidents(store, ph["idle"][0], ph["tail"][1])
    assert not [i for i in found if i["incident"] in {"gpu_fault", "oom_risk"}], found


def _iso(ms: int) -> str:
    from vllm_sentinel.collectors.timefmt import iso_precise
    return iso_precise(ms)


def test_oom_risk_and_gpu_fault_fire_on_generated_gpu_series_through_ingest(tmp_path):
    """GPU incidents proven through the operator's path: a dcgm-style dump, `ingest`, `diagnose`."""
    import json
    import subprocess
    import sys

    t0 = 1_795_946_400  # s; 15 minutes at 5 s
    gpu = 'gpu="0",UUID="GPU-1",modelName="NVIDIA H200"'
    lines = []
    for i in range(180):
        t = (t0 + 5 * i) * 1000
        used = 60_000 + min(i, 120) * 700  # MiB: fills up to ~144 GB of 143.7 GiB, then stays
        lines.append(f"DCGM_FI_DEV_FB_USED{{{gpu}}} {used} {t}")
        lines.append(f"DCGM_FI_DEV_FB_FREE{{{gpu}}} {max(143_771 - used, 500)} {t}")
        xid = 79 if i >= 150 else 0  # the GPU falls off the bus at minute 12.5
        lines.append(f"DCGM_FI_DEV_XID_ERRORS{{{gpu}}} {xid} {t}")
    dump = tmp_path / "gpu.prom"
    dump.write_text("\n".join(lines) + "\n")
    db = tmp_path / "g.duckdb"
    run = lambda *a: subprocess.run([sys.executable, "-m", "vllm_sentinel", *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=300)
    res = run("ingest", str(dump), "--instance", "gpu-node:8000", "--db", str(db))
    assert res.returncode == 0, res.stderr
    res = run("diagnose", "--since", "15m", "--until", str(t0 + 900), "--db", str(db), "--format", "json")
    assert res.returncode == 0, res.stderr
    found = {(i["incident"], i["rule"]) for i in json.loads(res.stdout)["incidents"]}
    assert ("oom_risk", "VllmGpuMemoryNearlyFull") in found
    assert ("gpu_fault", "VllmGpuXidError") in found
    assert ("oom_risk", "VllmGpuMemoryTrendingToOom") in found
