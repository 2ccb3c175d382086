"""`vllm-sentinel demo --replay`: the diagnosis pipeline on a recorded real session, in seconds.

The recording (reports/recordings/*.prom.gz, made by reports/recordings/record_session.py on the
real vLLM CPU server) is ingested into a temporary store with the configuration snapshots the
sidecar took during that session (the .json beside it), then diagnosed over its whole span
exactly as `vllm-sentinel diagnose` does: the shipped rule pack, fixes from the configuration in
force.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from vllm_sentinel import reports as _reports_pkg
from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.diagnosis import liveconfig
from vllm_sentinel.agent.diagnosis.diagnose import diagnose
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.ingest import ingest_file

RECORDING_NAME = "cpu-tiny-llama"


class ReplayError(Exception):
    """The recording cannot be replayed; the message names the file and the fix."""


def recordings_dir() -> Path:
    """Where the shipped recordings live (reports/recordings/)."""
    return Path(_reports_pkg.__file__).parent / "recordings"


def default_recording() -> Path:
    """The shipped recording of a real session (queue blocking, KV pressure, a stall)."""
    return recordings_dir() / f"{RECORDING_NAME}.prom.gz"


def metadata_path(recording: Path) -> Path:
    """The JSON beside a recording: x.prom.gz -> x.json."""
    name = recording.name
    for suffix in (".prom.gz", ".prom", ".gz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return recording.with_name(name + ".json")


def load_metadata(recording: Path) -> dict:
    """The recording's metadata (scenario phases, server command line, configuration snapshots); {} if absent."""
    path = metadata_path(recording)
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ReplayError(f"{path} is not valid JSON ({e}); restore it from the repository") from e


def restore_snapshots(store: Store, meta: dict) -> int:
    """Put the session's configuration snapshots into `store`; returns how many."""
    n = 0
    for snap in meta.get("config_snapshots", []):
        cfg = liveconfig.LiveConfig.from_json(snap["instance"], json.dumps(snap["config"]),
                                              json.dumps(snap["sources"]), snap["ts"])
        n += liveconfig.save_snapshot(store, cfg, int(snap["ts"]))
    return n


def replay_into(store: Store, recording: Path, say: Callable[[str], None] = lambda _m: None) -> tuple[int, int]:
    """Ingest `recording` (and its snapshots) into `store`; returns the (first, last) sample times in ms."""
    if not recording.exists():
        raise ReplayError(f"recording {recording} not found; reinstall vllm-sentinel or pass another file")
    say(f"ingesting the recorded session {recording.name}")
    res = ingest_file(store, recording)
    if res.first_ms is None or res.last_ms is None:
        raise ReplayError(f"{recording} holds no samples; re-record it with reports/recordings/record_session.py")
    restore_snapshots(store, load_metadata(recording))
    say(f"{res.samples:,} samples of {', '.join(res.instances)} over {(res.last_ms - res.first_ms) / 1000:.0f} s")
    return res.first_ms, res.last_ms


def run_replay(say: Callable[[str], None] = lambda _m: None, recording: Path | None = None,
               db: Path | None = None, rules: list[Path] | None = None) -> dict:
    """Ingest the recording into a temporary store (or `db`, kept) and return the diagnose document."""
    recording = Path(recording) if recording is not None else default_recording()
    evaluate = pack_window_evaluator(load_pack(rules))
    with tempfile.TemporaryDirectory(prefix="vllm-sentinel-replay-") as tmp:
        path = Path(db) if db is not None else Path(tmp) / "replay.duckdb"
        with Store.open(path) as store:
            first, last = replay_into(store, recording, say)
            say("diagnosing the whole session with the shipped rule pack")
            doc = diagnose(store, first - 1, last, source=f"recording:{recording.name}", evaluate_window=evaluate)
    say(f"{len(doc['incidents'])} incident(s): {', '.join(sorted({i['incident'] for i in doc['incidents']})) or 'none'}")
    return doc
