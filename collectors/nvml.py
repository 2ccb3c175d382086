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

import socket
import time
from typing import Any

from .base import Batch, CollectorStatus
from .nvml_calls import INIT_FIXES, NvmlGpu, nvml_error_name, nvml_text, quiet
from .nvml_events import NvmlEventWatcher, WatchedGpu
from .nvml_readings import NvmlReadings


class NvmlCollector(NvmlReadings):
    """Samples every GPU NVML sees; a failure becomes status text, never an exception."""

    name = "nvml"

    def __init__(self, nvml: Any = None, instance: str = "localhost", hostname: str | None = None,
                 slow_interval_s: float = 10.0, retry_init_s: float = 60.0,
                 process_memory: bool = True, events: bool = True, gpm: bool = True,
                 event_wait_ms: int = 500) -> None:
        super().__init__(nvml)
        self._instance = instance
        self._hostname = hostname if hostname is not None else socket.gethostname()
        self._slow_ms = int(slow_interval_s * 1000)
        self._retry_ms = int(retry_init_s * 1000)
        self._want_processes = process_memory
        self._want_events = events
        self._want_gpm = gpm
        self._event_wait_ms = event_wait_ms
        self._next_init_ms: int | None = None
        self._last_slow_ms: int | None = None
        self._gpus: list[NvmlGpu] = []
        self._driver = ""
        self._watcher: NvmlEventWatcher | None = None
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
                        quiet(self._nvml.nvmlGpmSampleFree, sample)
            quiet(self._nvml.nvmlShutdown)
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
            fix = INIT_FIXES.get(short, "check `nvidia-smi` on this host")
            self._problem("init", f"NVML init failed ({nvml_error_name(nvml, code)}): {fix}")
            return False
        except OSError as exc:
            self._problem("init", f"NVML init failed ({exc}): {INIT_FIXES['LIBRARY_NOT_FOUND']}")
            return False
        self._problems.pop("init", None)
        try:
            self._driver = nvml_text(nvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - a label only
            self._driver = ""
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self._problem("init", f"NVML cannot count GPUs ({nvml_error_name(nvml, exc.value)}): check `nvidia-smi`")
            quiet(nvml.nvmlShutdown)
            return False
        if count == 0:
            self._problem("no_gpu", "NVML sees no GPU: pass the GPUs into the sidecar's container "
                          "(--gpus all, NVIDIA_VISIBLE_DEVICES) or disable the nvml collector")
            quiet(nvml.nvmlShutdown)
            return False
        self._problems.pop("no_gpu", None)
        self._gpus = [g for g in (self._open_gpu(i) for i in range(count)) if g is not None]
        if not self._gpus:
            quiet(nvml.nvmlShutdown)
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
