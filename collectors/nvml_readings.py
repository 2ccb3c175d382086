"""What each NVML reading becomes: dcgm-exporter series per GPU, every tick (fast) or at the slow cadence.

Also GPM (Hopper+) metrics, taken as the difference of two sample buffers, NVML field values read in
one call, and XID events counted per GPU. Opening a GPU (labels, GPM buffers) is here too.
"""

from __future__ import annotations

from .base import Batch, Event, format_labels
from .nvml_calls import (CLOCK_EVENTS, GPM_METRICS, INIT_FIXES, MIB, GpmBuffers, NvmlCalls, NvmlGpu, field_number,
                         nvml_error_name, nvml_text)


class NvmlReadings(NvmlCalls):
    """Per-GPU readings into a Batch, named as dcgm-exporter names them."""

    _hostname: str
    _want_gpm: bool
    _want_processes: bool

    def _open_gpu(self, index: int) -> NvmlGpu | None:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            name = nvml_error_name(nvml, exc.value)
            fix = INIT_FIXES.get(name.removeprefix("NVML_ERROR_"), "check `nvidia-smi`")
            self._problem(f"gpu{index}", f"GPU {index} cannot be opened ({name}): {fix}")
            return None
        gpu = NvmlGpu(index=index, handle=handle, labels={}, label_text="")
        uuid = nvml_text(self._get(gpu, "uuid", "nvmlDeviceGetUUID", handle) or "")
        model = nvml_text(self._get(gpu, "name", "nvmlDeviceGetName", handle) or "")
        pci = self._get(gpu, "pci", "nvmlDeviceGetPciInfo", handle)
        minor = self._get(gpu, "minor", "nvmlDeviceGetMinorNumber", handle)
        gpu.labels = {"gpu": str(index), "UUID": uuid, "modelName": model,
                      "device": f"nvidia{minor if minor is not None else index}",
                      "pci_bus_id": nvml_text(getattr(pci, "busId", "")) if pci is not None else "",
                      "Hostname": self._hostname}
        gpu.label_text = format_labels(gpu.labels)
        if self._want_gpm and not gpu.lost:
            gpu.gpm = self._open_gpm(gpu)
        return gpu

    def _open_gpm(self, gpu: NvmlGpu) -> GpmBuffers | None:
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
        return GpmBuffers(samples=samples, metric_ids=ids)

    # ------------------------------------------------------------------ polling

    def _poll_fast(self, gpu: NvmlGpu, batch: Batch) -> None:
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

    def _clock_events(self, gpu: NvmlGpu, batch: Batch) -> None:
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

    def _processes(self, gpu: NvmlGpu, batch: Batch) -> None:
        procs = self._get(gpu, "processes", "nvmlDeviceGetComputeRunningProcesses", gpu.handle)
        for proc in procs or []:
            used = getattr(proc, "usedGpuMemory", None)
            if used is None:  # NVML cannot attribute memory (WDDM, or no permission to see it)
                continue
            batch.add("nvml_process_fb_used_mib", {**gpu.labels, "pid": str(proc.pid)}, float(int(used) // MIB))

    def _gpm(self, gpu: NvmlGpu, batch: Batch) -> None:
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

    def _poll_slow(self, gpu: NvmlGpu, batch: Batch) -> None:
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

    def _field_values(self, gpu: NvmlGpu, batch: Batch, fields: tuple[tuple[str, str], ...]) -> None:
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
            number = field_number(value)
            if number is not None:
                batch.add(metric, gpu.label_text, number)

    def _emit_events(self, gpu: NvmlGpu, events: list[Event], batch: Batch) -> None:
        """XID events -> a DCGM_FI_DEV_XID_ERRORS sample at the event's time, and a per-XID count."""
        for event in events:
            if event.kind != "xid" or event.labels.get("gpu") != str(gpu.index):
                continue
            xid = event.labels.get("xid", "0")
            gpu.last_xid = int(xid)
            gpu.xid_totals[xid] = gpu.xid_totals.get(xid, 0) + 1
            batch.add("DCGM_FI_DEV_XID_ERRORS", gpu.label_text, float(xid), ts_ms=event.ts_ms)
