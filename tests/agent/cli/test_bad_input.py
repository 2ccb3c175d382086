"""Bad command lines, as a careless operator types them: a one-line error naming the problem, exit != 0, no traceback.

Every case runs the real CLI in a subprocess (`python -m vllm_sentinel ...`), against files made here:
a corrupt and a truncated .gz, a directory, a binary file, broken model configs.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.ingest import ingest_text

ROOT = Path(__file__).resolve().parents[3]

_CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "max_position_embeddings": 128, "torch_dtype": "float16"}


def _make_files(d: Path) -> None:
    """The bad inputs the table names by file name."""
    (d / "corrupt.gz").write_bytes(b"\x1f\x8b\x08\x00garbage that is not deflate")
    full = gzip.compress(b'vllm:num_requests_running{instance="a"} 1\n' * 2000)
    (d / "truncated.gz").write_bytes(full[: len(full) // 2])
    (d / "adir").mkdir()
    (d / "binary.bin").write_bytes(bytes(range(256)) * 10)
    (d / "metrics.txt").write_text('vllm:num_requests_running{instance="a"} 1\n')
    with Store.open(d / "nochange.duckdb") as store:  # data of one instance, no change in it
        ingest_text(store, 'vllm:num_requests_running{instance="a"} 1\n', None, int(time.time() * 1000))
    (d / "bad.yaml").write_text("groups: [unclosed\n")
    (d / "params.yaml").write_text("no_such_param: 3\n")
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    for name, change in (("heads0", {"num_attention_heads": 0, "num_key_value_heads": 0}),
                         ("negative", {"num_hidden_layers": -2, "hidden_size": -64}),
                         ("strings", {"num_hidden_layers": "two"}),
                         ("huge", {"num_hidden_layers": 10**30}),
                         ("listcfg", None),
                         ("ok", {})):
        cfg = [1, 2] if change is None else {**_CONFIG, **change}
        (d / f"{name}.json").write_text(json.dumps(cfg))


# (id, argv with {d} for the files' folder, a word the error line must contain)
CASES = [
    # ingest
    ("ingest-corrupt-gz", ["ingest", "{d}/corrupt.gz"], "gzip"),
    ("ingest-truncated-gz", ["ingest", "{d}/truncated.gz"], "truncated"),
    ("ingest-directory", ["ingest", "{d}/adir"], "directory"),
    ("ingest-missing-file", ["ingest", "{d}/nope.txt"], "nope.txt"),
    ("ingest-binary", ["ingest", "{d}/binary.bin"], "binary.bin"),
    ("ingest-bad-at", ["ingest", "{d}/metrics.txt", "--at", "yesterday"], "yesterday"),
    ("ingest-huge-at", ["ingest", "{d}/metrics.txt", "--at", "99999999999999999999"], "99999999999999999999"),
    ("ingest-db-is-directory", ["ingest", "{d}/metrics.txt", "--db", "{d}/adir"], "adir"),
    # diagnose
    ("diagnose-huge-since", ["diagnose", "--since", "99999999999d"], "99999999999d"),
    ("diagnose-huge-until", ["diagnose", "--until", "99999999999999999999"], "99999999999999999999"),
    ("diagnose-bad-since", ["diagnose", "--since", "soon"], "soon"),
    ("diagnose-zero-since", ["diagnose", "--since", "0s"], "--since"),
    ("diagnose-bad-until", ["diagnose", "--until", "2026-13-45"], "2026-13-45"),
    ("diagnose-nan-until", ["diagnose", "--until", "nan"], "nan"),
    ("diagnose-bad-format", ["diagnose", "--format", "xml"], "xml"),
    ("diagnose-binary-params", ["diagnose", "--params", "{d}/binary.bin"], "binary.bin"),
    ("diagnose-missing-params", ["diagnose", "--params", "{d}/nope.yaml"], "nope.yaml"),
    ("diagnose-directory-params", ["diagnose", "--params", "{d}/adir"], "adir"),
    ("diagnose-bad-rules", ["diagnose", "--rules", "{d}/bad.yaml"], "bad.yaml"),
    ("diagnose-markup-since", ["diagnose", "--since", "[/]"], "[/]"),
    ("diagnose-db-is-directory", ["diagnose", "--db", "{d}/adir"], "adir"),
    ("diagnose-db-is-binary", ["diagnose", "--db", "{d}/binary.bin"], "binary.bin"),
    # capacity
    ("capacity-short-bin", ["capacity", "--bin", "2s", "--db", "{d}/none.duckdb"], "--bin"),
    ("capacity-bad-bin", ["capacity", "--bin", "often"], "often"),
    ("capacity-bin-over-since", ["capacity", "--bin", "2h", "--since", "1h"], "--bin"),
    ("capacity-bad-target", ["capacity", "--target-rate", "fast"], "fast"),
    ("capacity-zero-target", ["capacity", "--target-rps", "0"], "--target-rps"),
    ("capacity-two-targets", ["capacity", "--target-rate", "2/s", "--target-rps", "2"], "--target-rps"),
    ("capacity-zero-ttft", ["capacity", "--ttft-p95", "0s"], "--ttft-p95"),
    ("capacity-bad-tpot", ["capacity", "--tpot-p95", "quick"], "quick"),
    ("capacity-knee-below-one", ["capacity", "--knee-factor", "0.5"], "--knee-factor"),
    ("capacity-bad-format", ["capacity", "--format", "xml"], "xml"),
    ("capacity-out-without-markdown", ["capacity", "--out", "{d}/adir"], "--out"),
    ("capacity-no-data", ["capacity", "--db", "{d}/none.duckdb"], "none.duckdb"),
    ("capacity-db-is-binary", ["capacity", "--db", "{d}/binary.bin"], "binary.bin"),
    ("capacity-missing-params", ["capacity", "--params", "{d}/nope.yaml"], "nope.yaml"),
    ("capacity-db-and-prometheus", ["capacity", "--db", "{d}/none.duckdb", "--prometheus", "http://127.0.0.1:9"],
     "--prometheus"),
    # report, status, capture
    ("report-no-data", ["report", "abc", "--db", "{d}/none.duckdb"], "none.duckdb"),
    ("report-bad-rules", ["report", "abc", "--rules", "{d}/binary.bin"], "binary.bin"),
    ("report-markup-id", ["report", "[/]", "--db", "{d}/none.duckdb"], "none.duckdb"),
    ("status-no-daemon", ["status", "--db", "{d}/none.duckdb"], "no daemon"),
    ("status-bad-format", ["status", "--format", "xml", "--db", "{d}/none.duckdb"], "xml"),
    ("capture-bad-profiler", ["capture", "--target", "http://127.0.0.1:9", "--vllm-profiler", "later"], "later"),
    ("capture-negative-record", ["capture", "--target", "http://127.0.0.1:9", "--record", "-3"], "--record"),
    ("capture-bad-format", ["capture", "--target", "http://127.0.0.1:9", "--format", "xml"], "xml"),
    # plan
    ("plan-heads-zero", ["plan", "--model", "{d}/heads0.json"], "num_attention_heads"),
    ("plan-negative-fields", ["plan", "--model", "{d}/negative.json"], "num_hidden_layers"),
    ("plan-string-field", ["plan", "--model", "{d}/strings.json"], "num_hidden_layers"),
    ("plan-huge-field", ["plan", "--model", "{d}/huge.json", "--kv-cache-gib", "1"], "num_hidden_layers"),
    ("plan-list-config", ["plan", "--model", "{d}/listcfg.json"], "JSON object"),
    ("plan-deep-json", ["plan", "--model", "{d}/deep.json"], "deep.json"),
    ("plan-binary-config", ["plan", "--model", "{d}/binary.bin"], "binary.bin"),
    ("plan-missing-model", ["plan", "--model", "{d}/nope"], "nope"),
    ("plan-kv-nan", ["plan", "--model", "{d}/ok.json", "--kv-cache-gib", "nan"], "--kv-cache-gib"),
    ("plan-kv-inf", ["plan", "--model", "{d}/ok.json", "--kv-cache-gib", "inf"], "--kv-cache-gib"),
    ("plan-kv-negative", ["plan", "--model", "{d}/ok.json", "--kv-cache-gib", "-1"], "--kv-cache-gib"),
    ("plan-gpu-nan", ["plan", "--model", "{d}/ok.json", "--gpu-mem-gib", "nan", "--non-kv-gib", "1"], "--gpu-mem-gib"),
    ("plan-non-kv-inf", ["plan", "--model", "{d}/ok.json", "--gpu-mem-gib", "80", "--non-kv-gib", "inf"],
     "--non-kv-gib"),
    ("plan-util-nan", ["plan", "--model", "{d}/ok.json", "--gpu-memory-utilization", "nan"],
     "--gpu-memory-utilization"),
    ("plan-zero-block", ["plan", "--model", "{d}/ok.json", "--block-size", "0"], "--block-size"),
    ("plan-bad-dtype", ["plan", "--model", "{d}/ok.json", "--kv-cache-dtype", "int3"], "int3"),
    # rules
    ("rules-check-binary", ["rules", "check", "{d}/binary.bin"], "binary.bin"),
    ("rules-check-missing", ["rules", "check", "{d}/nope.yaml"], "nope.yaml"),
    ("rules-check-bad-yaml", ["rules", "check", "{d}/bad.yaml"], "bad.yaml"),
    ("rules-check-binary-params", ["rules", "check", "--params", "{d}/binary.bin"], "binary.bin"),
    ("rules-check-unknown-param", ["rules", "check", "--params", "{d}/params.yaml"], "no_such_param"),
    ("rules-test-binary", ["rules", "test", "{d}/binary.bin"], "binary.bin"),
    ("rules-test-missing", ["rules", "test", "{d}/nope.test.yaml"], "nope.test.yaml"),
    ("rules-test-bad-regex", ["rules", "test", "--run", "(["], "--run"),
    ("rules-list-bad-format", ["rules", "list", "--format", "xml"], "xml"),
    ("rules-list-binary", ["rules", "list", "{d}/binary.bin"], "binary.bin"),
    ("rules-export-binary-params", ["rules", "export", "--out", "{d}/exported", "--params", "{d}/binary.bin"],
     "binary.bin"),
    ("rules-export-out-is-file", ["rules", "export", "--out", "{d}/metrics.txt"], "metrics.txt"),
    # run: every one fails on validation, before anything starts
    ("run-port-too-big", ["run", "-t", "http://127.0.0.1:9", "--metrics-port", "99999"], "--metrics-port"),
    ("run-port-negative", ["run", "-t", "http://127.0.0.1:9", "--metrics-port", "-5"], "--metrics-port"),
    ("run-bad-interval", ["run", "-t", "http://127.0.0.1:9", "--interval", "fast"], "fast"),
    ("run-zero-interval", ["run", "-t", "http://127.0.0.1:9", "--interval", "0s"], "--interval"),
    ("run-huge-retention", ["run", "-t", "http://127.0.0.1:9", "--retention", "99999999999999d"], "--retention"),
    ("run-bad-target", ["run", "-t", "not a url"], "not a url"),
    ("run-bad-nvml", ["run", "-t", "http://127.0.0.1:9", "--nvml", "maybe"], "maybe"),
    ("run-binary-params", ["run", "-t", "http://127.0.0.1:9", "--params", "{d}/binary.bin"], "binary.bin"),
    ("run-bad-rules", ["run", "-t", "http://127.0.0.1:9", "--rules", "{d}/bad.yaml"], "bad.yaml"),
    ("run-bad-alertmanager", ["run", "-t", "http://127.0.0.1:9", "--alertmanager", "ftp://x"], "ftp://x"),
    ("run-zero-max-bytes", ["run", "-t", "http://127.0.0.1:9", "--scrape-max-bytes", "0"], "--scrape-max-bytes"),
    ("run-bad-store-memory", ["run", "-t", "http://127.0.0.1:9", "--db", "{d}/sm.duckdb", "--metrics-port", "0",
                              "--store-memory", "lots"], "--store-memory"),
    ("run-db-is-directory", ["run", "-t", "http://127.0.0.1:9", "--db", "{d}/adir", "--metrics-port", "0"], "adir"),
    # compare
    ("compare-bad-window", ["compare", "--before", "soon..2h", "--after", "1h..now"], "soon"),
    ("compare-reversed-window", ["compare", "--before", "1h..2h", "--after", "1h..now"], "1h..2h"),
    ("compare-not-a-window", ["compare", "--before", "2h", "--after", "1h..now"], "START..END"),
    ("compare-before-alone", ["compare", "--before", "2h..1h"], "--after"),
    ("compare-bad-settle", ["compare", "--settle", "long"], "long"),
    ("compare-bad-change", ["compare", "--change", "yesterday"], "--change"),
    ("compare-bad-format", ["compare", "--format", "xml"], "xml"),
    ("compare-versus-alone", ["compare", "--versus", "b:8000"], "--instance"),
    ("compare-out-without-markdown", ["compare", "--out", "{d}/charts"], "--out"),
    ("compare-no-data", ["compare", "--db", "{d}/nochange.duckdb", "--until", "0"], "no vLLM samples"),
    ("compare-no-change", ["compare", "--db", "{d}/nochange.duckdb"], "no configuration change"),
    # demo
    ("demo-negative-seconds", ["demo", "--seconds", "-1"], "--seconds"),
    ("demo-workdir-is-file", ["demo", "--replay", "--workdir", "{d}/metrics.txt"], "metrics.txt"),
    ("demo-bare-cpu-budget", ["demo", "--cpu-budget", "5"], "--cpu-budget 5%"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad-input")
    _make_files(d)
    return d


def run_cli(args: list[str], home: Path) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, with its default store and data under `home`."""
    env = {**os.environ, "HOME": str(home), "XDG_DATA_HOME": str(home / "data"), "COLUMNS": "200",
           "VLLM_SENTINEL_DB": str(home / "default.duckdb")}
    return subprocess.run([sys.executable, "-m", "vllm_sentinel", *args], cwd=home, env=env, capture_output=True,
                          text=True, timeout=120)


def error_lines(stderr: str) -> list[str]:
    """The stderr lines that are not typer's usage box (its frame, usage line and hint)."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.lstrip().startswith(("╭", "│", "╰", "Usage:",
                                                                                          "Try "))]


def test_the_table_covers_every_command() -> None:
    commands = {argv[0] if argv[0] != "rules" else f"rules {argv[1]}" for _, argv, _ in CASES}
    assert commands >= {"run", "diagnose", "compare", "report", "ingest", "status", "capture", "plan", "demo",
                        "rules test", "rules check", "rules list", "rules export"}
    assert len(CASES) >= 40


@pytest.mark.parametrize("args, word", [(a, w) for _, a, w in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_a_nonzero_exit(files: Path, args: list[str], word: str) -> None:
    argv = [a.replace("{d}", str(files)) for a in args]
    proc = run_cli(argv, files)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = error_lines(proc.stderr)
    if not lines:  # a usage error: typer's box names the option and the problem
        assert word.lower() in proc.stderr.lower(), proc.stderr
        return
    assert len(lines) == 1, proc.stderr
    assert word.lower() in lines[0].lower(), proc.stderr
