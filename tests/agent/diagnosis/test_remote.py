"""`diagnose --prometheus` against a real Prometheus 2.42 holding the recorded real session.

reports/recordings/cpu-tiny-llama.prom.gz (a real vLLM CPU server, see its README) is loaded twice:
into DuckDB with `ingest`, and into Prometheus with `promtool tsdb create-blocks-from openmetrics`.
The same samples on both sides, so both sources must name the same incidents with the same ids,
evidence values, fixes and health figures: the rule pack evaluated by Prometheus' engine through
query_range equals the replay over the store. No vLLM here; Prometheus is started by the test on a
free loopback port (run it under /work/heavy.lock on a shared machine).
"""

from __future__ import annotations

import importlib
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.diagnosis.test_change_points import INSTANCE as DUMPED
from tests.agent.diagnosis.test_change_points import loaded as dump_loaded
from tests.agent.diagnosis.test_change_points import user_case
from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.demo.prometheus_server import PrometheusServer, backfill, write_openmetrics
from vllm_sentinel.agent.demo.replay import default_recording, load_metadata
from vllm_sentinel.agent.diagnosis.compare import CompareRequest, compare
from vllm_sentinel.agent.diagnosis.compare_sources import remote_source as remote_compare_source
from vllm_sentinel.agent.diagnosis.compare_sources import store_source
from vllm_sentinel.agent.demo.vllm_server import free_port
from vllm_sentinel.agent.diagnosis.capacity import CapacityQuery, capacity
from vllm_sentinel.agent.diagnosis.change_points import find_changes
from vllm_sentinel.agent.diagnosis.diagnose import NoDataInWindow, diagnose
from vllm_sentinel.agent.diagnosis.remote import diagnose_remote
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.promql.remote import RemoteEngine
from vllm_sentinel.agent.promql.scope import parse_selector
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.ingest import ingest_file
from vllm_sentinel.collectors.prometheus import PrometheusClient, PrometheusConnection, PrometheusQueryError
from vllm_sentinel.collectors.timefmt import iso_seconds

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                reason="Prometheus 2.42 (Debian package prometheus) not installed")

INSTANCE = "127.0.0.1:44241"  # the recorded server's


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory):
    """(store, Prometheus, first_ms, last_ms): the recording in DuckDB and in a running Prometheus."""
    tmp = tmp_path_factory.mktemp("remote")
    om = write_openmetrics(default_recording(), tmp / "recording.om")
    backfill(om, tmp / "prom" / "tsdb")
    with Store.open(tmp / "ingested.duckdb") as store:
        res = ingest_file(store, default_recording())
        with PrometheusServer(tmp / "prom") as prom:
            yield store, prom, res.first_ms, res.last_ms


def engine_of(prom: PrometheusServer, selector: str = "") -> RemoteEngine:
    return RemoteEngine(PrometheusClient(PrometheusConnection(prom.url)), parse_selector(selector) if selector else ())


def both(loaded, selector: str = "") -> tuple[dict, dict]:
    store, prom, first, last = loaded
    pack = load_pack()
    local = diagnose(store, first - 1, last, evaluate_window=pack_window_evaluator(pack))
    remote = diagnose_remote(engine_of(prom, selector), first - 1, last, None, pack)
    return local, remote


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_prometheus_names_the_same_incidents_with_the_same_evidence_and_fixes(loaded) -> None:
    local, remote = both(loaded)
    assert remote["source"] == f"prometheus:{loaded[1].url}" and remote["instances"] == [INSTANCE]
    names = [i["incident"] for i in remote["incidents"]]
    # the session was made to show these (reports/recordings/README.md): the comparison is not vacuous
    assert {"queue_blocking", "kv_cache_pressure", "engine_stall", "target_down"} <= set(names)
    assert [(i["id"], i["incident"], i["start"], i["end"], i["state"]) for i in remote["incidents"]] == \
           [(i["id"], i["incident"], i["start"], i["end"], i["state"]) for i in local["incidents"]]
    for r, l in zip(remote["incidents"], local["incidents"]):
        assert [e["signal"] for e in r["evidence"]] == [e["signal"] for e in l["evidence"]]
        for er, el in zip(r["evidence"], l["evidence"]):
            assert close(er["value"], el["value"]), (r["incident"], er["signal"], er["value"], el["value"])
        assert r["fixes"] == l["fixes"], r["incident"]
        assert r["summary"] == l["summary"] and close(r["peak"], l["peak"])
        assert (r["episode"], r["caused_by"]) == (l["episode"], l["caused_by"]), r["incident"]
    kv = next(i for i in remote["incidents"] if i["incident"] == "kv_cache_pressure")
    queue = next(i for i in remote["incidents"] if i["incident"] == "queue_blocking")
    assert kv["caused_by"] == [] and kv["id"] in queue["caused_by"]  # the cause first, from Prometheus too
    fix = next(f for f in kv["fixes"] if f["param"] == "--max-num-seqs")
    assert (fix["param"], fix["current"], fix["suggested"]) == ("--max-num-seqs", "4", "1")  # the server ran with 4
    assert fix["current_source"].startswith("inferred from behaviour: at most 4 requests ran")


def test_the_health_summary_is_the_same_from_both_sources(loaded) -> None:
    local, remote = both(loaded)
    [ls], [rs] = local["summary"], remote["summary"]
    assert rs["series"] == ls["series"] > 200
    for name, value in ls["signals"].items():
        assert close(rs["signals"][name], value), name
    for name, values in ls["trends"].items():
        assert all(close(a, b) for a, b in zip(rs["trends"][name], values)), name


def test_inferred_configuration_says_so(loaded) -> None:
    _local, remote = both(loaded)
    sources = remote["config"][INSTANCE]["sources"]
    assert sources["num_gpu_blocks"] == "cache_config_info" and remote["config"][INSTANCE]["values"]["num_gpu_blocks"] == 8
    assert sources["max_num_batched_tokens"].startswith("inferred (the command line is not in the metrics): default")
    assert sources["max_num_seqs"].startswith("inferred from behaviour")


def test_a_selector_scopes_every_query(loaded) -> None:
    local, remote = both(loaded, f'{{instance="{INSTANCE}"}}')
    assert [i["id"] for i in remote["incidents"]] == [i["id"] for i in local["incidents"]]


def test_a_selector_that_matches_nothing_says_what_is_there(loaded) -> None:
    _store, prom, first, last = loaded
    with pytest.raises(NoDataInWindow) as e:
        diagnose_remote(engine_of(prom, '{job="vllm"}'), first - 1, last, None, load_pack())
    msg = str(e.value)
    assert msg.startswith(f'--selector {{job="vllm"}} matches no vLLM series in Prometheus at {prom.url} between ')
    assert f"holds vLLM series of 1 instance(s) ({INSTANCE})" in msg and "\n" not in msg


def test_a_window_without_data(loaded) -> None:
    _store, prom, first, _last = loaded
    with pytest.raises(NoDataInWindow, match=r"no vLLM series \(vllm:num_requests_running\) in Prometheus at"):
        diagnose_remote(engine_of(prom), first - 7_200_000, first - 3_600_000, None, load_pack())


def test_long_ranges_are_split_under_the_real_points_limit(loaded) -> None:
    store, prom, first, last = loaded
    step = 20  # 480 s at 20 ms: 24,000 points per series, over Prometheus' 11,000
    client = PrometheusClient(PrometheusConnection(prom.url))
    with pytest.raises(PrometheusQueryError, match="exceeded maximum resolution of 11,000 points per timeseries"):
        client._range_piece("vllm:num_requests_waiting", first, last, step)  # what one query would get
    [remote] = client.query_range("vllm:num_requests_waiting", first, last, step)
    [local] = Engine(store).range("vllm:num_requests_waiting", first, last, step)
    assert len(remote.points) > 20_000 and remote.points == local.points


# -- the command line ------------------------------------------------------------------------------------

def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vllm_sentinel", *args], capture_output=True, text=True, timeout=300)


def window_args(first: int, last: int) -> list[str]:
    until = last // 1000 * 1000 + 1000
    return ["--since", f"{(until - first) // 1000 + 1}s", "--until", iso_seconds(until)]


def test_cli_json_contract_and_report_from_prometheus(loaded, tmp_path: Path) -> None:
    store, prom, first, last = loaded
    args = window_args(first, last)
    done = cli("diagnose", "--prometheus", prom.url, *args, "--format", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["source"] == f"prometheus:{prom.url}" and doc["step_seconds"] == 5
    assert set(doc) >= {"window", "source", "instances", "incidents", "summary"}
    assert doc["summary_source"] == "prometheus"
    local = diagnose(store, *_cli_window(args), evaluate_window=pack_window_evaluator(load_pack()))
    assert [i["id"] for i in doc["incidents"]] == [i["id"] for i in local["incidents"]]
    kv = next(i for i in doc["incidents"] if i["incident"] == "kv_cache_pressure")
    assert kv["report"].startswith(f"vllm-sentinel report {kv['id'][:12]} --prometheus {prom.url} --since ")
    # the printed command finds the incident again: the same window, the same stable id
    words = kv["report"].split()[2:]
    rep = cli("report", *words, "--out", str(tmp_path))
    assert rep.returncode == 0, rep.stderr
    md = (tmp_path / kv["id"] / "report.md").read_text()
    assert kv["id"] in md and "`--max-num-seqs` | 4 | inferred from behaviour" in md
    assert "**`--max-num-seqs` 4 → 1**" in md
    assert "Prometheus holds metrics only" in rep.stderr  # stacks: said, not silently missing


def _cli_window(args: list[str]) -> tuple[int, int]:
    from vllm_sentinel.collectors.timefmt import parse_cli_duration_ms, parse_time_ms
    end = parse_time_ms(args[3])
    return end - parse_cli_duration_ms(args[1]), end


def test_cli_report_of_an_unknown_id_names_the_window(loaded, tmp_path: Path) -> None:
    _store, prom, first, last = loaded
    done = cli("report", "ffffffffffff", "--prometheus", prom.url, *window_args(first, last), "--out", str(tmp_path))
    assert done.returncode == 1
    assert "no incident 'ffffffffffff' in what prometheus:" in done.stderr and "pass the --since/--until" in done.stderr


def test_cli_errors_are_one_line(loaded) -> None:
    _store, prom, first, last = loaded
    port = free_port()
    for args, code, text in [
        (["--prometheus", f"http://127.0.0.1:{port}"], 1, "connection refused"),
        (["--prometheus", prom.url, "--selector", 'job="vllm"'], 2, "give label matchers in braces"),
        (["--prometheus", prom.url, "--db", "/tmp/x.duckdb"], 2, "two sources of history"),
        (["--selector", '{job="vllm"}'], 2, "--selector only apply with --prometheus URL"),
    ]:
        done = cli("diagnose", *args, *window_args(first, last))
        assert done.returncode == code, (args, done.stderr)
        assert text in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory):
    """The recording in a Prometheus behind TLS and basic auth (its --web.config.file), as fleets run it."""
    tmp = tmp_path_factory.mktemp("guarded")
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    try:  # bcrypt hashes for Prometheus' basic_auth_users, from the C library (the module left Python in 3.13)
        crypt = importlib.import_module("crypt")
    except ImportError:
        pytest.skip("no crypt module to make a bcrypt hash with")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    (tmp / "password").write_text("s3cret\n")
    (tmp / "wrong").write_text("guess\n")
    backfill(write_openmetrics(default_recording(), tmp / "recording.om"), tmp / "prom" / "tsdb")
    web = {"tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
           "basic_auth_users": {"ops": crypt.crypt("s3cret", crypt.mksalt(crypt.METHOD_BLOWFISH))}}
    with PrometheusServer(tmp / "prom", web_config=web) as prom:
        yield prom, tmp


def test_tls_and_basic_auth_against_a_real_prometheus(guarded, loaded) -> None:
    prom, tmp = guarded
    _store, _p, first, last = loaded
    base = ["diagnose", "--prometheus", prom.url, *window_args(first, last), "--format", "json"]
    ok = cli(*base, "--basic-auth-user", "ops", "--basic-auth-password-file", str(tmp / "password"),
             "--ca-file", str(tmp / "cert.pem"))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["instances"] == [INSTANCE]
    wrong = cli(*base, "--basic-auth-user", "ops", "--basic-auth-password-file", str(tmp / "wrong"),
                "--insecure-skip-verify")
    assert wrong.returncode == 1 and "answered HTTP 401" in wrong.stderr and "--basic-auth-user" in wrong.stderr
    untrusted = cli(*base, "--basic-auth-user", "ops", "--basic-auth-password-file", str(tmp / "password"))
    assert untrusted.returncode == 1 and "TLS verification of" in untrusted.stderr and "--ca-file" in untrusted.stderr


def test_capacity_from_prometheus_equals_capacity_from_the_file(loaded) -> None:
    """`capacity --prometheus` reads the same bins, levels, SLO point, knee and routing as `capacity --db`."""
    store, prom, first, last = loaded
    query = CapacityQuery(first // 1000 * 1000, last // 1000 * 1000 + 30_000, 30_000, 5.0, 0.05, target_rps=20.0)
    local = capacity(Engine(store), query)
    remote = capacity(engine_of(prom), query)
    assert len(local["bins"]) >= 10 and local["slo_point"] is not None and local["routing"] is not None
    assert [b["end"] for b in remote["bins"]] == [b["end"] for b in local["bins"]]
    for key in ("coverage", "slo_point", "knee", "replicas", "routing"):
        assert json.dumps(remote[key], sort_keys=True) == json.dumps(local[key], sort_keys=True) or \
            _numbers_close(remote[key], local[key]), key
    assert len(remote["levels"]) == len(local["levels"])
    assert all(_numbers_close(a, b) for a, b in zip(remote["levels"], local["levels"]))


def _numbers_close(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_numbers_close(a[k], b[k]) for k in a)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    return a == b


def test_compare_reads_the_same_from_prometheus(loaded) -> None:
    """compare over Prometheus and over the store, same windows: the same values, significance and incidents."""
    store, prom, first, last = loaded
    phases = {s["name"]: (s["start_ms"] // 1000 * 1000, s["end_ms"] // 1000 * 1000)
              for s in load_metadata(default_recording())["scenarios"]}
    req = CompareRequest((first - 1, last), before=phases["queue_blocking"], after=phases["kv_cache_pressure"])
    pack = load_pack()
    local = compare(store_source(store, pack_window_evaluator(pack)), req)
    remote = compare(remote_compare_source(engine_of(prom), pack), req)
    assert [s["name"] for s in remote["signals"]] == [s["name"] for s in local["signals"]]
    for r, s in zip(remote["signals"], local["signals"]):
        assert (r["significant"], r["better"]) == (s["significant"], s["better"]), (r, s)
        assert close(r["before"], s["before"]) and close(r["after"], s["after"]), (r, s)
    assert remote["incidents"] == local["incidents"] and "kv_cache_pressure" in remote["incidents"]["started"]
    # goodput fell beyond the noise on both: one decision procedure over the same reading
    assert remote["verdict"] == local["verdict"] == "regressed"
    assert remote["verdict_reasons"][0].startswith("goodput_rps ") and local["verdict_reasons"][0].startswith(
        "goodput_rps "), (remote["verdict_reasons"], local["verdict_reasons"])
    for key in ("attainment", "goodput_rps"):
        for side in ("before", "after"):
            assert close(remote["slo"][key][side], local["slo"][key][side]), (key, remote["slo"], local["slo"])
    assert remote["slo"]["method"] == local["slo"]["method"] and "le=1.0" in local["slo"]["method"]


@pytest.fixture(scope="module")
def relabelled(tmp_path_factory: pytest.TempPathFactory):
    """(dump, Prometheus): test_change_points' user case (cache_config_info relabelled after a minute without
    samples, counters from zero) backfilled into a running Prometheus."""
    d = user_case()
    tmp = tmp_path_factory.mktemp("relabelled")
    (tmp / "dump.prom").write_text(d.text)
    backfill(write_openmetrics(tmp / "dump.prom", tmp / "dump.om"), tmp / "prom" / "tsdb")
    with PrometheusServer(tmp / "prom") as prom:
        yield d, prom


def test_prometheus_shows_the_same_configuration_change_and_restart_as_the_ingested_dump(relabelled) -> None:
    """A fleet's Prometheus has no sidecar snapshots: the relabelled info series and the restart behind the gap
    come from its metrics, the same changes at the same milliseconds as from the ingested dump, and
    `compare --change auto` through remote_source sets the same windows and lists the same differences."""
    d, prom = relabelled
    engine = engine_of(prom)
    with dump_loaded(d) as store:
        local_points = find_changes(Engine(store), DUMPED, *d.stretch)
        local = compare(store_source(store, pack_window_evaluator(load_pack())), CompareRequest(d.stretch))
    remote_points = find_changes(engine, DUMPED, *d.stretch)
    assert [p.kind for p in remote_points] == ["configuration", "restart"], [p.as_dict() for p in remote_points]
    assert remote_points == local_points
    remote = compare(remote_compare_source(engine, load_pack()), CompareRequest(d.stretch))
    assert remote["window"] == local["window"] and remote["window"]["change"]["kind"] == "configuration change"
    assert remote["config_changes"] == local["config_changes"]
    assert [(c["param"], c["before"], c["after"]) for c in remote["config_changes"]] == [
        ("--gpu-memory-utilization", "0.9", "0.95"), ("num_gpu_blocks", "9000", "12000")]
