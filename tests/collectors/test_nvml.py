"""collectors/nvml.py against NVML calls recorded on an H200 (fakenvml replays them), and its error paths."""

from __future__ import annotations

import gzip
import logging
import sys
import time
from collections import defaultdict

import pytest

from tests.collectors.fakenvml import ERRORS, H200_DUMP, FakeNvml, dump_phases, read_dump
from vllm_sentinel.collectors.nvml import NvmlCollector

HOSTNAME = "vm"  # the device's host name, a label of every recorded series


def make(fake: FakeNvml, **kw) -> NvmlCollector:
    """A collector configured as on the device run (slow group every 5 s)."""
    kw.setdefault("events", False)
    return NvmlCollector(nvml=fake, instance="h200", hostname=HOSTNAME, slow_interval_s=5.0, **kw)


def replay(fake: FakeNvml, collector: NvmlCollector, ticks: list[int]):
    try:
        return [collector.collect(t) for t in ticks]
    finally:
        collector.close()


# ---------------------------------------------------------------- replay of the H200 run

def test_replay_reproduces_what_the_collector_stored_on_the_h200():
    fake = FakeNvml()
    batches = replay(fake, make(fake, events=True, event_wait_ms=20), fake.header["ticks_ms"])
    got = [(m, lab, v, ts if ts is not None else b.ts_ms)
           for b in batches for m, lab, v, ts in zip(b.metrics, b.labels, b.values, b.timestamps_ms)]
    assert got == read_dump()
    assert fake.unrecorded == []
    assert all(b.status.ok for b in batches)


def test_h200_series_carry_dcgm_exporter_names_labels_and_units():
    samples = read_dump()
    names = {m for m, _, _, _ in samples}
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                 "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS",
                 "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
                 "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
                 "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                 "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "nvml_process_fb_used_mib"):
        assert name in names, name
    labels = samples[0][1]
    for label in ('gpu="0"', 'UUID="GPU-', 'modelName="NVIDIA H200"', 'device="nvidia0"', "pci_bus_id="):
        assert label in labels
    last = {m: v for m, _, v, _ in samples}
    assert 140_000 < last["DCGM_FI_DEV_FB_TOTAL"] < 150_000          # MiB (143771 on an H200)
    assert 600 <= last["DCGM_FI_DEV_POWER_MGMT_LIMIT"] <= 1000       # W, not mW
    prof = [v for m, _, v, _ in samples if m.startswith("DCGM_FI_PROF_") and m.endswith("_ACTIVE")]
    assert prof and all(0.0 <= v <= 1.0 for v in prof)               # ratios, as DCGM, not percent


def test_the_load_process_shows_up_with_its_pid():
    pids = {lab.split('pid="')[1].split('"')[0] for m, lab, _, _ in read_dump() if m == "nvml_process_fb_used_mib"}
    assert len(pids) == 1
    peak = max(v for m, _, v, _ in read_dump() if m == "nvml_process_fb_used_mib")
    assert peak > 8192  # the load held two 4 GiB buffers


def test_h200_power_cap_appears_as_a_clock_event_in_the_compute_phase():
    phases = dump_phases()
    start, end = phases["compute_bound"]
    in_phase = [v for m, _, v, ts in read_dump() if m == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" and start + 2000 < ts <= end]
    assert in_phase and all(int(v) & 0x4 for v in in_phase)  # SW power cap (700 W) while the SM clock drops
    totals = [(lab, v) for m, lab, v, _ in read_dump() if m == "DCGM_EXP_CLOCK_EVENTS_TOTAL"]
    assert any('clock_event="power_cap"' in lab and v >= 1 for lab, v in totals)


def test_dump_is_strict_prometheus_text_that_ingest_reads():
    from vllm_sentinel.collectors.exposition import parse

    text = gzip.open(H200_DUMP, "rt").read()
    parsed = parse(text, openmetrics=False, strict=True)
    assert parsed.errors == [] and len(parsed.names) == len(read_dump())


# ---------------------------------------------------------------- bandwidth-bound condition

def gpu_bandwidth_bound(dram_active: float | None, tensor_active: float | None,
                        mem_copy_util: float | None = None) -> bool:
    """GPU half of `bandwidth_bound_decode`: DRAM busy, tensor pipes comparatively idle.

    With GPM/DCP metrics (ratios 0..1): dram_active >= 0.5 and tensor_active < 0.5 * dram_active.
    Without them (plain dcgm-exporter defaults): memory-controller utilisation >= 60 %.
    PromQL, as the rule pack will write it:
        (avg_over_time(DCGM_FI_PROF_DRAM_ACTIVE[1m]) >= 0.5)
        and on (instance, gpu)
        (avg_over_time(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE[1m]) < on (instance, gpu) 0.5 * avg_over_time(DCGM_FI_PROF_DRAM_ACTIVE[1m]))
      or on (instance, gpu)
        (avg_over_time(DCGM_FI_DEV_MEM_COPY_UTIL[1m]) >= 60 unless on (instance, gpu) DCGM_FI_PROF_DRAM_ACTIVE)
    Example: memory-bound copies on the H200 read dram 0.885, tensor 0.0 -> True;
    8192^3 bf16 matmuls read dram 0.17, tensor 0.93 -> False.
    """
    if dram_active is not None and tensor_active is not None:
        return dram_active >= 0.5 and tensor_active < 0.5 * dram_active
    return mem_copy_util is not None and mem_copy_util >= 60


def _windows(metric: str, window_ms: int) -> dict[int, float]:
    """avg_over_time(metric[window]) at each sample time, over the recorded dump."""
    series = [(ts, v) for m, _, v, ts in read_dump() if m == metric]
    return {t: sum(v for ts, v in series if t - window_ms < ts <= t) / sum(1 for ts, _ in series if t - window_ms < ts <= t)
            for t, _ in series}


@pytest.mark.parametrize("with_gpm", [True, False])
def test_bandwidth_bound_holds_in_the_memory_phase_and_not_in_the_compute_phase(with_gpm):
    def verdicts(phase: str, window: int) -> list[bool]:
        dram = _windows("DCGM_FI_PROF_DRAM_ACTIVE", window)
        tensor = _windows("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", window)
        copy = _windows("DCGM_FI_DEV_MEM_COPY_UTIL", window)
        start, end = dump_phases()[phase]
        # windows wholly inside the phase; GPM values describe the tick before, hence +1 s
        times = [t for t in copy if start + window + 1000 <= t <= end]
        assert times, phase
        return [gpu_bandwidth_bound(dram.get(t) if with_gpm else None, tensor.get(t) if with_gpm else None, copy[t])
                for t in times]

    assert all(verdicts("memory_bound", 10_000))
    assert not any(verdicts("compute_bound", 10_000))
    for idle in ("idle", "gap", "tail"):
        assert not any(verdicts(idle, 2_000)), idle


# ---------------------------------------------------------------- degrading cleanly

def test_unsupported_getters_are_asked_once_and_listed_in_status():
    fake = FakeNvml()
    collector = make(fake)
    batches = replay(fake, collector, fake.header["ticks_ms"])
    # Hopper has no page retirement (it remaps rows): NOT_SUPPORTED on the H200, asked once per cause
    assert fake.count("nvmlDeviceGetRetiredPages") == 2
    assert fake.count("nvmlDeviceGetRetiredPagesPendingStatus") == 1
    status = batches[-1].status
    assert status.ok and status.error is None
    assert {"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE"} <= set(status.detail["unsupported"]["0"])
    assert any("NVML_ERROR_NOT_SUPPORTED" in note for note in status.detail["notes"])


def test_slow_getters_run_on_their_own_cadence():
    fake = FakeNvml()
    ticks = fake.header["ticks_ms"]
    replay(fake, make(fake), ticks)
    assert fake.count("nvmlDeviceGetUtilizationRates") == len(ticks)
    expected_slow = len(range(0, ticks[-1] - ticks[0] + 1, 5000))
    assert fake.count("nvmlDeviceGetTotalEnergyConsumption") == expected_slow
    assert fake.count("nvmlDeviceGetPcieThroughput") == 2 * expected_slow


def test_missing_nvml_library_is_reported_once_with_the_fix(caplog):
    fake = FakeNvml()
    fake.fail("nvmlInit", ERRORS["LIBRARY_NOT_FOUND"])
    collector = make(fake, retry_init_s=60)
    with caplog.at_level(logging.INFO, logger="vllm_sentinel.collectors"):
        batches = [collector.collect(1_000 + 1000 * i) for i in range(5)]
    assert all(len(b) == 0 for b in batches)
    status = batches[-1].status
    assert not status.ok
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in status.error and "libnvidia-ml.so.1" in status.error
    assert "--gpus all" in status.error
    assert fake.count("nvmlInit") == 1                       # retried only after retry_init_s
    assert len(caplog.records) == 1
    collector.collect(61_000 + 1_000)
    assert fake.count("nvmlInit") == 2


def test_nvidia_ml_py_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    batch = NvmlCollector(nvml=None, hostname=HOSTNAME).collect(1_000)
    assert not batch.status.ok and "pip install" in batch.status.error and "nvidia-ml-py" in batch.status.error


def test_no_gpu_visible():
    fake = FakeNvml()
    fake.answer("nvmlDeviceGetCount", 0)
    batch = make(fake).collect(1_000)
    assert len(batch) == 0 and not batch.status.ok
    assert "sees no GPU" in batch.status.error and "NVIDIA_VISIBLE_DEVICES" in batch.status.error


def test_no_permission_to_open_the_gpu():
    fake = FakeNvml()
    fake.fail("nvmlDeviceGetHandleByIndex", ERRORS["NO_PERMISSION"])
    batch = make(fake).collect(1_000)
    assert not batch.status.ok
    assert "NVML_ERROR_NO_PERMISSION" in batch.status.error and "/dev/nvidia" in batch.status.error


def test_no_permission_for_one_getter_drops_only_that_getter():
    fake = FakeNvml()
    fake.fail("nvmlDeviceGetComputeRunningProcesses", ERRORS["NO_PERMISSION"])
    ticks = fake.header["ticks_ms"][:10]
    batches = replay(fake, make(fake), ticks)
    assert fake.count("nvmlDeviceGetComputeRunningProcesses") == 1
    assert "DCGM_FI_DEV_GPU_UTIL" in batches[-1].metrics
    assert not batches[-1].status.ok and "nvmlDeviceGetComputeRunningProcesses" in batches[-1].status.error


def test_gpu_falling_off_the_bus_is_reported_once_and_not_polled_again(caplog):
    fake = FakeNvml()
    ticks = fake.header["ticks_ms"][:20]
    collector = make(fake)
    with caplog.at_level(logging.INFO, logger="vllm_sentinel.collectors"):
        before = [collector.collect(t) for t in ticks[:5]]
        fake.fail("nvmlDeviceGetMemoryInfo", ERRORS["GPU_IS_LOST"])
        after = [collector.collect(t) for t in ticks[5:]]
    collector.close()
    assert all(b.status.ok for b in before)
    calls_when_lost = fake.count("nvmlDeviceGetUtilizationRates")
    assert calls_when_lost == 6                                   # the tick that hit the error, then none
    assert all(len(b) == 0 for b in after[1:])
    status = after[-1].status
    assert not status.ok and "fallen off the bus" in status.error and "Xid 79" in status.error
    assert status.detail["lost_gpus"] == [0]
    assert sum("fallen off the bus" in r.getMessage() for r in caplog.records) == 1


def test_transient_errors_keep_polling_and_never_raise():
    fake = FakeNvml()
    fake.fail("nvmlDeviceGetPowerUsage", ERRORS["UNKNOWN"], times=2)
    ticks = fake.header["ticks_ms"][:4]
    batches = replay(fake, make(fake), ticks)
    assert ["DCGM_FI_DEV_POWER_USAGE" in b.metrics for b in batches] == [False, False, True, True]
    assert all(b.status.ok for b in batches)


def test_a_broken_binding_does_not_escape_collect():
    fake = FakeNvml()
    fake.answer("nvmlDeviceGetUtilizationRates", "not a struct")  # attribute access fails inside collect
    batch = make(fake).collect(fake.header["ticks_ms"][0])
    assert not batch.status.ok and "NVML collector bug" in batch.status.error


def test_xid_event_becomes_an_event_and_a_dcgm_sample():
    fake = FakeNvml()
    collector = make(fake, events=True, event_wait_ms=20)
    ticks = fake.header["ticks_ms"]
    collector.collect(ticks[0])
    assert collector.status().detail["events"] == {"0": sorted(collector.status().detail["events"]["0"])}
    assert "xid" in collector.status().detail["events"]["0"]
    fake.push_event(0, fake.nvmlEventTypeXidCriticalError, 79)
    events, batch = [], None
    for t in ticks[1:40]:  # bounded: the watcher thread wakes every 20 ms
        batch = collector.collect(t)
        events += batch.events
        if events:
            break
        time.sleep(0.05)
    collector.close()
    assert [e.kind for e in events] == ["xid"]
    event = events[0]
    assert event.labels["xid"] == "79" and event.labels["gpu"] == "0" and "fallen off the bus" in event.message
    xid = [(v, ts) for m, v, ts in zip(batch.metrics, batch.values, batch.timestamps_ms) if m == "DCGM_FI_DEV_XID_ERRORS"]
    assert (79.0, event.ts_ms) in xid                            # a sample at the event's own time
    assert (79.0, None) in xid                                   # and the last XID at the tick, as DCGM
    totals = defaultdict(float)
    for m, lab, v in zip(batch.metrics, batch.labels, batch.values):
        if m == "DCGM_EXP_XID_ERRORS_TOTAL":
            totals[lab.split('xid="')[1].split('"')[0]] = v
    assert totals == {"79": 1.0}


def test_event_registration_refused_is_a_note_not_a_failure():
    fake = FakeNvml()
    fake.fail("nvmlDeviceRegisterEvents", ERRORS["NOT_SUPPORTED"])
    collector = make(fake, events=True, event_wait_ms=20)
    batch = collector.collect(fake.header["ticks_ms"][0])
    collector.close()
    assert batch.status.ok and "DCGM_FI_DEV_GPU_UTIL" in batch.metrics
    assert any("cannot watch XID" in n for n in batch.status.detail["notes"])
