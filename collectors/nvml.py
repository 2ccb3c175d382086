"""GPU samples from NVML (nvidia-ml-py), named and labelled as NVIDIA's dcgm-exporter names them.

The NVML module is a parameter (`nvml=`; default: `import pynvml` at first use), so tests drive
the collector with a replay of readings recorded on an H200 (tests/collectors/fakenvml.py).
Only the standard library and the injected module are imported here: the collector must run
where nothing but python and nvidia-ml-py is installed.

Series (labels gpu, UUID, device, modelName, pci_bus_id, Hostname, as dcgm-exporter):
  every tick   DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_MEM_COPY_UTIL (%), DCGM_FI_DEV_FB_USED/FREE/TOTAL
               (MiB), DCGM_FI_DEV_POWER_USAGE (W), DCGM_FI_DEV_SM_CLOCK/MEM_CLOCK (MHz),
               DCGM_FI_DEV_GPU_TEMP/MEMORY_TEMP (C), DCGM_FI_DEV_CLOCKS_EVENT_REASONS (NVML bitmask),
               DCGM_EXP_CLOCK_EVENTS_TOTAL{clock_event} (onsets seen since start),
               DCGM_FI_DEV_XID_ERRORS (last XID, 0 = none), DCGM_EXP_XID_ERRORS_TOTAL{xid},
               nvml_process_fb_used_mib{pid} (no dcgm-exporter counterpart),
               GPM (Hopper+), ratios 0..1 over the tick: DCGM_FI_PROF_DRAM_ACTIVE, _SM_ACTIVE,
               _SM_OCCUPANCY, _PIPE_TENSOR_ACTIVE, _GR_ENGINE_ACTIVE, _PIPE_FP16/32/64_ACTIVE,
               _PIPE_TENSOR_HMMA_ACTIVE; DCGM_FI_PROF_PCIE_TX/RX_BYTES, NVLINK_TX/RX_BYTES (B/s)
  slow cadence DCGM_FI_DEV_PCIE_TX/RX_THROUGHPUT (KB/s, ~20 ms a call), DCGM_FI_DEV_TOTAL_ENERGY_
               CONSUMPTION (mJ, ~3 ms), DCGM_FI_DEV_POWER_MGMT_LIMIT/ENFORCED_POWER_LIMIT (W),
               DCGM_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL, DCGM_FI_DEV_RETIRED_SBE/DBE/PENDING,
               DCGM_FI_DEV_{CORRECTABLE,UNCORRECTABLE}_REMAPPED_ROWS, DCGM_FI_DEV_ROW_REMAP_
               PENDING/FAILURE, DCGM_FI_DEV_PCIE_REPLAY_COUNTER
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from .base import Batch, CollectorStatus, Event, format_labels
from .nvml_events import NvmlEventWatcher, WatchedGpu

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# GPM metric constant name -> (dcgm-exporter name, factor to the DCGM unit).
GPM_METRICS: dict[str, tuple[str, float]] = {
    "NVML_GPM_METRIC_DRAM_BW_UTIL": ("DCGM_FI_PROF_DRAM_ACTIVE", 0.01),
    "NVML_GPM_METRIC_SM_UTIL": ("DCGM_FI_PROF_SM_ACTIVE", 0.01),
    "NVML_GPM_METRIC_SM_OCCUPANCY": ("DCGM_FI_PROF_SM_OCCUPANCY", 0.01),
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.01),
    "NVML_GPM_METRIC_HMMA_TENSOR_UTIL": ("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", 0.01),
    "NVML_GPM_METRIC_GRAPHICS_UTIL": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.01),
    "NVML_GPM_METRIC_FP16_UTIL": ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", 0.01),
    "NVML_GPM_METRIC_FP32_UTIL": ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", 0.01),
    "NVML_GPM_METRIC_FP64_UTIL": ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", 0.01),
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC": ("DCGM_FI_PROF_PCIE_TX_BYTES", float(MIB)),
    "NVML_GPM_METRIC_PCIE_RX_PER_SEC": ("DCGM_FI_PROF_PCIE_RX_BYTES", float(MIB)),
    "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": ("DCGM_FI_PROF_NVLINK_TX_BYTES", float(MIB)),
    "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": ("DCGM_FI_PROF_NVLINK_RX_BYTES", float(MIB)),
}

# NVML clocks-event bits -> dcgm-exporter's clock_event label values.
CLOCK_EVENTS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "clocks_setting", 0x4: "power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
    0x100: "display_clocks",
}

# NVMLError codes, with pynvml's values as defaults when a fake module lacks one.
_ERR = {"UNINITIALIZED": 1, "INVALID_ARGUMENT": 2, "NOT_SUPPORTED": 3, "NO_PERMISSION": 4,
        "NOT_FOUND": 6, "DRIVER_NOT_LOADED": 9, "TIMEOUT": 10, "LIBRARY_NOT_FOUND": 12,
        "FUNCTION_NOT_FOUND": 13, "CORRUPTED_INFOROM": 14, "GPU_IS_LOST": 15,
        "RESET_REQUIRED": 16, "LIB_RM_VERSION_MISMATCH": 18, "ARGUMENT_VERSION_MISMATCH": 25,
        "UNKNOWN": 999}


def nvml_error_name(nvml: Any, code: int | None) -> str:
    """NVML error code -> 'NVML_ERROR_NOT_SUPPORTED'-style name (or the number)."""
    for name, default in _ERR.items():
        if getattr(nvml, f"NVML_ERROR_{name}", default) == code:
            return f"NVML_ERROR_{name}"
    return f"NVML error {code}"


# What to do about init failures, by error: the problem and the fix, in one line.
_INIT_FIXES = {
    "LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 not found: install the NVIDIA driver, or run the container "
                         "with the NVIDIA runtime (--gpus all / nvidia-container-toolkit)",
    "DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded: check `nvidia-smi` and `lsmod | grep nvidia`",
    "NO_PERMISSION": "no permission to open /dev/nvidia*: run the sidecar as root or add it to the "
                     "group owning /dev/nvidia*, and pass the devices into its container",
    "LIB_RM_VERSION_MISMATCH": "NVML library and kernel driver versions differ (driver updated "
                               "without a reboot): reboot or reload the nvidia modules",
    "GPU_IS_LOST": "a GPU has fallen off the bus: check `dmesg` for Xid 79, drain the node and reset the GPU",
}


@dataclass
class _Gpm:
    """Two GPM sample buffers per GPU; metrics are the difference between the last two."""

    samples: list[Any]
    metric_ids: dict[int, tuple[str, float]]
    prev: Any = None
    next: int = 0


@dataclass
class _Gpu:
    index: int
    handle: Any
    labels: dict[str, str]
    label_text: str
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    gpm: _Gpm | None = None
    last_reasons: int = 0
    clock_event_totals: dict[str, int] = field(default_factory=dict)
    last_xid: int = 0
    xid_totals: dict[str, int] = field(default_factory=dict)


class NvmlCollector:
    """Samples every GPU NVML sees; a failure becomes status text, never an exception."""

    name = "nvml"

    def __init__(self, nvml: Any = None, instance: str = "localhost", hostname: str | None = None,
                 slow_interval_s: float = 10.0, retry_init_s: float = 60.0,
                 process_memory: bool = True, events: bool = True, gpm: bool = True,
                 event_wait_ms: int = 500) -> None:
        self._nvml = nvml
        self._instance = instance
        self._hostname = hostname if hostname is not None else socket.gethostname()
        self._slow_ms = int(slow_interval_s * 1000)
        self._retry_ms = int(retry_init_s * 1000)
        self._want_processes = process_memory
        self._want_events = events
        self._want_gpm = gpm
        self._event_wait_ms = event_wait_ms
        self._ready = False
        self._next_init_ms: int | None = None
        self._last_slow_ms: int | None = None
        self._gpus: list[_Gpu] = []
        self._driver = ""
        self._watcher: NvmlEventWatcher | None = None
        self._problems: dict[str, str] = {}   # key -> one line, blocking (status not ok)
        self._notes: dict[str, str] = {}      # key -> one line, informative (unsupported getters)
        self._last_poll_ms = 0.0
        self._last_slow_poll_ms = 0.0

    # ------------------------------------------------------------------ public

    def collect(self, now_ms: int) -> Batch:
        """One poll of every GPU; unsupported getters are skipped, errors land in the status."""
        batch = Batch(instance=self._instance, ts_ms=now_ms)
        try:
            if self._ensure_init(now_ms):
                start = time.perf_counter()
                slow = self._last_slow_ms is None or now_ms - self._last_slow_ms >= self._slow_ms
                events = self._watcher.drain() if self._watcher else []
                for gpu in self._gpus:
                    self._emit_events(gpu, events, batch)  # first: the tick's XID sample then shows them
                    if not gpu.lost:
                        self._poll_fast(gpu, batch)
                if slow:
                    self._last_slow_ms = now_ms
                    slow_start = time.perf_counter()
                    for gpu in self._gpus:
                        if not gpu.lost:
                            self._poll_slow(gpu, batch)
                    self._last_slow_poll_ms = (time.perf_counter() - slow_start) * 1000
                batch.events.extend(events)
                self._last_poll_ms = (time.perf_counter() - start) * 1000
        except Exception as exc:  # noqa: BLE001 - a collector never raises into the daemon
            self._problem("internal", f"NVML collector bug: {type(exc).__name__}: {exc} "
                          "(please report it; the other collectors keep running)")
        batch.status = self.status()
        return batch

    def status(self) -> CollectorStatus:
        """Health now: problems that need action in `error`, unsupported getters in `detail`."""
        if self._watcher is not None:
            for key, text in self._watcher.problems.items():
                self._notes.setdefault(f"events:{key}", text)
        detail: dict[str, object] = {
            "gpus": len(self._gpus),
            "driver": self._driver,
            "lost_gpus": [g.index for g in self._gpus if g.lost],
            "unsupported": {str(g.index): sorted(g.unsupported) for g in self._gpus if g.unsupported},
            "gpm": {str(g.index): g.gpm is not None for g in self._gpus},
            "events": ({str(i): kinds for i, kinds in self._watcher.watching.items()}
                       if self._watcher else {}),
            "notes": list(self._notes.values()),
            "poll_ms": round(self._last_poll_ms, 3),
            "slow_poll_ms": round(self._last_slow_poll_ms, 3),
        }
        error = " | ".join(self._problems.values()) or None
        return CollectorStatus(name=self.name, ok=error is None, error=error, detail=detail)

    def close(self) -> None:
        """Stop the event thread, free GPM buffers and shut NVML down."""
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        if self._ready and self._nvml is not None:
            for gpu in self._gpus:
                if gpu.gpm is not None:
                    for sample in gpu.gpm.samples:
                        _quiet(self._nvml.nvmlGpmSampleFree, sample)
            _quiet(self._nvml.nvmlShutdown)
        self._ready = False

    # ------------------------------------------------------------------ init

    def _ensure_init(self, now_ms: int) -> bool:
        if self._ready:
            return True
        if self._next_init_ms is not None and now_ms < self._next_init_ms:
            return False
        self._next_init_ms = now_ms + self._retry_ms
        if self._watcher is not None:  # NVML went away and comes back: start the watcher afresh
            self._watcher.stop()
            self._watcher = None
        if self._nvml is None:
            try:
                import pynvml  # noqa: PLC0415 - optional dependency, imported only when used
            except ImportError:
                self._problem("init", "nvidia-ml-py is not installed: pip install 'vllm-sentinel[nvml]' "
                              "(or pip install nvidia-ml-py), or disable the nvml collector")
                return False
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            short = nvml_error_name(nvml, code).removeprefix("NVML_ERROR_")
            fix = _INIT_FIXES.get(short, "check `nvidia-smi` on this host")
            self._problem("init", f"NVML init failed ({nvml_error_name(nvml, code)}): {fix}")
            return False
        except OSError as exc:
            self._problem("init", f"NVML init failed ({exc}): {_INIT_FIXES['LIBRARY_NOT_FOUND']}")
            return False
        self._problems.pop("init", None)
        try:
            self._driver = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - a label only
            self._driver = ""
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self._problem("init", f"NVML cannot count GPUs ({nvml_error_name(nvml, exc.value)}): check `nvidia-smi`")
            _quiet(nvml.nvmlShutdown)
            return False
        if count == 0:
            self._problem("no_gpu", "NVML sees no GPU: pass the GPUs into the sidecar's container "
                          "(--gpus all, NVIDIA_VISIBLE_DEVICES) or disable the nvml collector")
            _quiet(nvml.nvmlShutdown)
            return False
        self._problems.pop("no_gpu", None)
        self._gpus = [g for g in (self._open_gpu(i) for i in range(count)) if g is not None]
        if not self._gpus:
            _quiet(nvml.nvmlShutdown)
            return False
        if self._want_events:
            watcher = NvmlEventWatcher(nvml, [WatchedGpu(g.index, g.handle, g.labels) for g in self._gpus
                                              if not g.lost], self._instance, wait_ms=self._event_wait_ms)
            if watcher.start():
                self._watcher = watcher
            else:
                for key, text in watcher.problems.items():
                    self._notes.setdefault(f"events:{key}", text)
        self._ready = True
        return True

    def _open_gpu(self, index: int) -> _Gpu | None:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            name = nvml_error_name(nvml, exc.value)
            fix = _INIT_FIXES.get(name.removeprefix("NVML_ERROR_"), "check `nvidia-smi`")
            self._problem(f"gpu{index}", f"GPU {index} cannot be opened ({name}): {fix}")
            return None
        gpu = _Gpu(index=index, handle=handle, labels={}, label_text="")
        uuid = _text(self._get(gpu, "uuid", "nvmlDeviceGetUUID", handle) or "")
        model = _text(self._get(gpu, "name", "nvmlDeviceGetName", handle) or "")
        pci = self._get(gpu, "pci", "nvmlDeviceGetPciInfo", handle)
        minor = self._get(gpu, "minor", "nvmlDeviceGetMinorNumber", handle)
        gpu.labels = {"gpu": str(index), "UUID": uuid, "modelName": model,
                      "device": f"nvidia{minor if minor is not None else index}",
                      "pci_bus_id": _text(getattr(pci, "busId", "")) if pci is not None else "",
                      "Hostname": self._hostname}
        gpu.label_text = format_labels(gpu.labels)
        if self._want_gpm and not gpu.lost:
            gpu.gpm = self._open_gpm(gpu)
        return gpu

    def _open_gpm(self, gpu: _Gpu) -> _Gpm | None:
        nvml = self._nvml
        support = self._get(gpu, "gpm", "nvmlGpmQueryDeviceSupport", gpu.handle)
        if support is None or not getattr(support, "isSupportedDevice", 0):
            gpu.unsupported.add("gpm")
            return None
        ids = {getattr(nvml, const): target for const, target in GPM_METRICS.items() if hasattr(nvml, const)}
        samples = []
        for _ in range(2):
            sample = self._get(gpu, "gpm", "nvmlGpmSampleAlloc")
            if sample is None:
                return None
            samples.append(sample)
        return _Gpm(samples=samples, metric_ids=ids)

    # ------------------------------------------------------------------ polling

    def _poll_fast(self, gpu: _Gpu, batch: Batch) -> None:
        nvml, h, lt = self._nvml, gpu.handle, gpu.label_text
        util = self._get(gpu, "utilization", "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            batch.add("DCGM_FI_DEV_GPU_UTIL", lt, float(util.gpu))
            batch.add("DCGM_FI_DEV_MEM_COPY_UTIL", lt, float(util.memory))
        mem = self._get(gpu, "memory", "nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            batch.add("DCGM_FI_DEV_FB_USED", lt, float(int(mem.used) // MIB))
            batch.add("DCGM_FI_DEV_FB_FREE", lt, float(int(mem.free) // MIB))
            batch.add("DCGM_FI_DEV_FB_TOTAL", lt, float(int(mem.total) // MIB))
        power = self._get(gpu, "power", "nvmlDeviceGetPowerUsage", h)
        if power is not None:
            batch.add("DCGM_FI_DEV_POWER_USAGE", lt, int(power) / 1000.0)
        for key, clock, metric in (("sm_clock", "NVML_CLOCK_SM", "DCGM_FI_DEV_SM_CLOCK"),
                                   ("mem_clock", "NVML_CLOCK_MEM", "DCGM_FI_DEV_MEM_CLOCK")):
            mhz = self._get(gpu, key, "nvmlDeviceGetClockInfo", h, getattr(nvml, clock))
            if mhz is not None:
                batch.add(metric, lt, float(mhz))
        temp = self._get(gpu, "temperature", "nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU)
        if temp is not None:
            batch.add("DCGM_FI_DEV_GPU_TEMP", lt, float(temp))
        self._field_values(gpu, batch, (("NVML_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEMORY_TEMP"),))
        self._clock_events(gpu, batch)
        batch.add("DCGM_FI_DEV_XID_ERRORS", lt, float(gpu.last_xid))
        for xid, total in sorted(gpu.xid_totals.items()):
            batch.add("DCGM_EXP_XID_ERRORS_TOTAL", {**gpu.labels, "xid": xid}, float(total))
        if self._want_processes:
            self._processes(gpu, batch)
        if gpu.gpm is not None:
            self._gpm(gpu, batch)

    def _clock_events(self, gpu: _Gpu, batch: Batch) -> None:
        """Bitmask as DCGM reports it, plus per-reason onset counters (PromQL has no bit tests)."""
        if hasattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons"):
            reasons = self._get(gpu, "clock_events", "nvmlDeviceGetCurrentClocksEventReasons", gpu.handle)
        else:
            reasons = self._get(gpu, "clock_events", "nvmlDeviceGetCurrentClocksThrottleReasons", gpu.handle)
        if reasons is None:
            return
        reasons = int(reasons)
        batch.add("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu.label_text, float(reasons))
        for bit, name in CLOCK_EVENTS.items():
            if reasons & bit and not gpu.last_reasons & bit:
                gpu.clock_event_totals[name] = gpu.clock_event_totals.get(name, 0) + 1
        gpu.last_reasons = reasons
        for name, total in sorted(gpu.clock_event_totals.items()):
            batch.add("DCGM_EXP_CLOCK_EVENTS_TOTAL", {**gpu.labels, "clock_event": name}, float(total))

    def _processes(self, gpu: _Gpu, batch: Batch) -> None:
        procs = self._get(gpu, "processes", "nvmlDeviceGetComputeRunningProcesses", gpu.handle)
        for proc in procs or []:
            used = getattr(proc, "usedGpuMemory", None)
            if used is None:  # NVML cannot attribute memory (WDDM, or no permission to see it)
                continue
            batch.add("nvml_process_fb_used_mib", {**gpu.labels, "pid": str(proc.pid)}, float(int(used) // MIB))

    def _gpm(self, gpu: _Gpu, batch: Batch) -> None:
        nvml, gpm = self._nvml, gpu.gpm
        assert gpm is not None
        current = gpm.samples[gpm.next]
        try:
            nvml.nvmlGpmSampleGet(gpu.handle, current)
        except nvml.NVMLError as exc:
            self._on_error(gpu, "gpm", "nvmlGpmSampleGet", exc)
            if "gpm" in gpu.unsupported or gpu.lost:
                gpu.gpm = None
            gpm.prev = None
            return
        previous, gpm.prev, gpm.next = gpm.prev, current, 1 - gpm.next
        if previous is None or not gpm.metric_ids:
            return
        ids = list(gpm.metric_ids)
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(ids)
        request.sample1 = previous
        request.sample2 = current
        for k, metric_id in enumerate(ids):
            request.metrics[k].metricId = metric_id
        try:
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError as exc:
            self._on_error(gpu, "gpm_metrics", "nvmlGpmMetricsGet", exc)
            return
        for k, metric_id in enumerate(ids):
            metric = request.metrics[k]
            name, factor = gpm.metric_ids[metric_id]
            if int(metric.nvmlReturn) != 0:
                # unsupported on this GPU or driver: ask no more
                del gpm.metric_ids[metric_id]
                gpu.unsupported.add(name)
                continue
            batch.add(name, gpu.label_text, float(metric.value) * factor)

    def _poll_slow(self, gpu: _Gpu, batch: Batch) -> None:
        nvml, h, lt = self._nvml, gpu.handle, gpu.label_text
        for key, counter, metric in (("pcie_tx", "NVML_PCIE_UTIL_TX_BYTES", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT"),
                                     ("pcie_rx", "NVML_PCIE_UTIL_RX_BYTES", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT")):
            kbs = self._get(gpu, key, "nvmlDeviceGetPcieThroughput", h, getattr(nvml, counter))
            if kbs is not None:
                batch.add(metric, lt, float(kbs))
        energy = self._get(gpu, "energy", "nvmlDeviceGetTotalEnergyConsumption", h)
        if energy is not None:
            batch.add("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", lt, float(energy))
        for key, fn, metric in (("power_limit", "nvmlDeviceGetPowerManagementLimit", "DCGM_FI_DEV_POWER_MGMT_LIMIT"),
                                ("enforced_power_limit", "nvmlDeviceGetEnforcedPowerLimit",
                                 "DCGM_FI_DEV_ENFORCED_POWER_LIMIT")):
            mw = self._get(gpu, key, fn, h)
            if mw is not None:
                batch.add(metric, lt, int(mw) / 1000.0)
        for error_type, counter, metric in (
                ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
                ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
                ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
                ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")):
            count = self._get(gpu, metric, "nvmlDeviceGetTotalEccErrors", h,
                              getattr(nvml, error_type), getattr(nvml, counter))
            if count is not None:
                batch.add(metric, lt, float(count))
        for cause, metric in (("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", "DCGM_FI_DEV_RETIRED_SBE"),
                              ("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", "DCGM_FI_DEV_RETIRED_DBE")):
            pages = self._get(gpu, metric, "nvmlDeviceGetRetiredPages", h, getattr(nvml, cause))
            if pages is not None:
                batch.add(metric, lt, float(len(pages)))
        pending = self._get(gpu, "retired_pending", "nvmlDeviceGetRetiredPagesPendingStatus", h)
        if pending is not None:
            batch.add("DCGM_FI_DEV_RETIRED_PENDING", lt, float(int(pending)))
        rows = self._get(gpu, "remapped_rows", "nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            corr, unc, rows_pending, failure = (int(x) for x in rows)
            batch.add("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", lt, float(corr))
            batch.add("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", lt, float(unc))
            batch.add("DCGM_FI_DEV_ROW_REMAP_PENDING", lt, float(rows_pending))
            batch.add("DCGM_FI_DEV_ROW_REMAP_FAILURE", lt, float(failure))
        self._field_values(gpu, batch, (("NVML_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),))

    def _field_values(self, gpu: _Gpu, batch: Batch, fields: tuple[tuple[str, str], ...]) -> None:
        """Read NVML field values in one call; a field the GPU lacks is dropped for good."""
        nvml = self._nvml
        wanted = [(getattr(nvml, const), metric) for const, metric in fields
                  if hasattr(nvml, const) and metric not in gpu.unsupported]
        if not wanted:
            return
        values = self._get(gpu, f"field_values:{wanted[0][1]}", "nvmlDeviceGetFieldValues", gpu.handle,
                           [f for f, _ in wanted])
        if values is None:
            return
        for (_, metric), value in zip(wanted, values):
            if int(value.nvmlReturn) != 0:
                gpu.unsupported.add(metric)
                continue
            number = _field_number(value)
            if number is not None:
                batch.add(metric, gpu.label_text, number)

    def _emit_events(self, gpu: _Gpu, events: list[Event], batch: Batch) -> None:
        """XID events -> a DCGM_FI_DEV_XID_ERRORS sample at the event's time, and a per-XID count."""
        for event in events:
            if event.kind != "xid" or event.labels.get("gpu") != str(gpu.index):
                continue
            xid = event.labels.get("xid", "0")
            gpu.last_xid = int(xid)
            gpu.xid_totals[xid] = gpu.xid_totals.get(xid, 0) + 1
            batch.add("DCGM_FI_DEV_XID_ERRORS", gpu.label_text, float(xid), ts_ms=event.ts_ms)

    # ------------------------------------------------------------------ errors

    def _get(self, gpu: _Gpu, key: str, fn_name: str, *args: Any) -> Any:
        """Call one NVML getter; None when it failed or is known not to work on this GPU."""
        if gpu.lost or key in gpu.unsupported:
            return None
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:
            gpu.unsupported.add(key)
            self._note(f"missing:{fn_name}", f"{fn_name} is not in this nvidia-ml-py: upgrade nvidia-ml-py")
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            self._on_error(gpu, key, fn_name, exc)
        except Exception as exc:  # noqa: BLE001 - e.g. a ctypes signature mismatch in an old binding
            gpu.unsupported.add(key)
            self._note(f"broken:{fn_name}", f"{fn_name} failed ({type(exc).__name__}: {exc}); not retried")
        return None

    def _on_error(self, gpu: _Gpu, key: str, fn_name: str, exc: Exception) -> None:
        nvml = self._nvml
        code = getattr(exc, "value", None)
        name = nvml_error_name(nvml, code)
        if code == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15):
            gpu.lost = True
            self._problem(f"lost:{gpu.index}",
                          f"GPU {gpu.index} ({gpu.labels.get('UUID') or '?'}) has fallen off the bus "
                          f"(NVML_ERROR_GPU_IS_LOST in {fn_name}): check `dmesg` for Xid 79, drain the node "
                          "and reset or reboot the GPU; its series stop until then")
        elif code == getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4):
            gpu.unsupported.add(key)
            self._problem(f"perm:{fn_name}",
                          f"{fn_name} needs more privileges (NVML_ERROR_NO_PERMISSION): run the sidecar as "
                          "root or with access to /dev/nvidia*; not retried")
        elif code in (getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3), getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
                      getattr(nvml, "NVML_ERROR_INVALID_ARGUMENT", 2),
                      getattr(nvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25)):
            gpu.unsupported.add(key)
            self._note(f"unsupported:{key}", f"{key} ({fn_name}) is not supported by this GPU or driver "
                       f"({name}); not asked again")
        elif code in (getattr(nvml, "NVML_ERROR_UNINITIALIZED", 1), getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9),
                      getattr(nvml, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18)):
            self._ready = False  # NVML went away under us: init again at the next retry time
            self._problem("init", f"NVML stopped working ({name} in {fn_name}): "
                          f"{_INIT_FIXES.get(name.removeprefix('NVML_ERROR_'), 'check `nvidia-smi`')}")
        else:
            # transient (TIMEOUT, UNKNOWN, ...): keep asking, say it once
            self._note(f"error:{fn_name}:{code}", f"{fn_name} on GPU {gpu.index} failed ({name}); retrying each tick")

    def _problem(self, key: str, text: str) -> None:
        if self._problems.get(key) != text:
            self._problems[key] = text
            log.warning("%s", text)

    def _note(self, key: str, text: str) -> None:
        if key not in self._notes:
            self._notes[key] = text
            log.info("%s", text)


def _field_number(value: Any) -> float | None:
    """An NVML field value's number, read from the union member its valueType names."""
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(
        int(value.valueType))
    if member is None:
        return None
    return float(getattr(value.value, member))


def _text(value: Any) -> str:
    """NVML strings arrive as bytes from old bindings, str from new ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _quiet(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - cleanup must not fail
        pass
