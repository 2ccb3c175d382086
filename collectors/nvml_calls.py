"""NVML calls made safe: one getter at a time, failures sorted into problems (need action) and notes.

What the GPU collector (collectors/nvml.py) and its readings (collectors/nvml_readings.py) share:
the dcgm-exporter naming tables, the per-GPU state, and `NvmlCalls`, which turns an NVML error
into a line an operator can act on and stops asking for what a GPU does not support.
Only the standard library and the injected NVML module are used here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

# one logger for the whole NVML collector, whichever of its modules speaks
log = logging.getLogger("vllm_sentinel.collectors.nvml")

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
INIT_FIXES = {
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
class GpmBuffers:
    """Two GPM sample buffers per GPU; metrics are the difference between the last two."""

    samples: list[Any]
    metric_ids: dict[int, tuple[str, float]]
    prev: Any = None
    next: int = 0


@dataclass
class NvmlGpu:
    """One GPU: its handle, dcgm-exporter labels, what it does not support, and its event counters."""

    index: int
    handle: Any
    labels: dict[str, str]
    label_text: str
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    gpm: GpmBuffers | None = None
    last_reasons: int = 0
    clock_event_totals: dict[str, int] = field(default_factory=dict)
    last_xid: int = 0
    xid_totals: dict[str, int] = field(default_factory=dict)


class NvmlCalls:
    """The NVML module, and what its failures taught: problems (status not ok) and notes (informative)."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml
        self._ready = False
        self._problems: dict[str, str] = {}   # key -> one line, blocking (status not ok)
        self._notes: dict[str, str] = {}      # key -> one line, informative (unsupported getters)

    def _get(self, gpu: NvmlGpu, key: str, fn_name: str, *args: Any) -> Any:
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

    def _on_error(self, gpu: NvmlGpu, key: str, fn_name: str, exc: Exception) -> None:
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
                          f"{INIT_FIXES.get(name.removeprefix('NVML_ERROR_'), 'check `nvidia-smi`')}")
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


def field_number(value: Any) -> float | None:
    """An NVML field value's number, read from the union member its valueType names."""
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(
        int(value.valueType))
    if member is None:
        return None
    return float(getattr(value.value, member))


def nvml_text(value: Any) -> str:
    """NVML strings arrive as bytes from old bindings, str from new ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def quiet(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - cleanup must not fail
        pass
