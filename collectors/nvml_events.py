"""XID and other critical GPU events from an NVML event set, read on a thread of its own.

`nvmlEventSetWait` blocks (in C, without the GIL) until an event or its timeout, so it cannot sit
in the sampling loop; this watcher queues what it sees and the collector drains the queue each
tick. The NVML module is injected, as in collectors/nvml.py.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from .base import Event, now_ms

log = logging.getLogger(__name__)

# What each NVML event type becomes in the events table: (kind, short description).
EVENT_KINDS: dict[str, tuple[str, str]] = {
    "nvmlEventTypeXidCriticalError": ("xid", "XID critical error"),
    "nvmlEventTypeDoubleBitEccError": ("ecc_dbe", "double-bit (uncorrectable) ECC error"),
    "nvmlEventTypeSingleBitEccErrorStorm": ("ecc_sbe_storm", "single-bit ECC error storm"),
    "nvmlEventTypeDramRetirementEvent": ("dram_retirement", "DRAM page retirement or row remap"),
    "nvmlEventTypeDramRetirementFailure": ("dram_retirement_failure", "DRAM retirement failed"),
    "nvmlEventTypeFatalPoisonError": ("fatal_poison", "fatal poison error"),
    "nvmlEventTypeNonFatalPoisonError": ("nonfatal_poison", "non-fatal poison error"),
    "nvmlEventTypeGpuUnavailableError": ("gpu_unavailable", "GPU unavailable"),
    "nvmlEventTypeGpuRecoveryAction": ("gpu_recovery_action", "GPU recovery action required"),
}

# The XIDs an operator meets most; the meaning goes into the event's message (NVIDIA XID catalogue).
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception (often an application bug: illegal memory access)",
    31: "GPU memory page fault (often an application bug)",
    43: "GPU stopped processing (a process was killed or faulted)",
    45: "preemptive cleanup after a fault (follows other XIDs)",
    48: "double-bit ECC error: restart the GPU's processes; if repeated, replace the GPU",
    61: "internal microcontroller breakpoint/warning",
    62: "internal microcontroller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus: drain the node and reset or reboot the GPU",
    92: "high single-bit ECC error rate",
    94: "contained ECC error: the affected application must restart",
    95: "uncontained ECC error: reset the GPU",
    109: "context switch timeout",
    119: "GSP RPC timeout: reset the GPU",
    120: "GSP error: reset the GPU",
}


@dataclass
class WatchedGpu:
    """One GPU the watcher listens to: its NVML index, handle and series labels."""

    index: int
    handle: Any
    labels: dict[str, str]


class NvmlEventWatcher:
    """Listens to an NVML event set on a daemon thread and queues Events for `drain()`."""

    def __init__(self, nvml: Any, gpus: list[WatchedGpu], instance: str,
                 wait_ms: int = 500, clock: Callable[[], int] = now_ms) -> None:
        self._nvml = nvml
        self._gpus = {g.index: g for g in gpus}
        self._instance = instance
        self._wait_ms = wait_ms
        self._clock = clock
        self._queue: list[Event] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._type_names = {getattr(nvml, name): name for name in EVENT_KINDS if hasattr(nvml, name)}
        self.watching: dict[int, list[str]] = {}  # gpu index -> kinds registered
        self.problems: dict[str, str] = {}

    def start(self) -> bool:
        """Create the event set, register every GPU, start the thread; False when nothing is watched."""
        nvml = self._nvml
        wanted = 0
        for value in self._type_names:
            wanted |= value
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:  # noqa: BLE001 - any failure only disables events
            self._problem("create", f"NVML event set not available ({_err_text(exc)}): "
                          "XID errors will not be recorded; upgrade the NVIDIA driver")
            return False
        for gpu in self._gpus.values():
            try:
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(gpu.handle))
                mask = supported & wanted
                if mask:
                    nvml.nvmlDeviceRegisterEvents(gpu.handle, mask, self._event_set)
                    self.watching[gpu.index] = sorted(
                        EVENT_KINDS[name][0] for value, name in self._type_names.items() if value & mask)
            except Exception as exc:  # noqa: BLE001
                self._problem(f"register:{gpu.index}",
                              f"GPU {gpu.index}: cannot watch XID/ECC events ({_err_text(exc)}); "
                              "in a VM or container the hypervisor may hide them, read XIDs on the host (dmesg)")
        if not self.watching:
            self._free()
            return False
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()
        return True

    def drain(self) -> list[Event]:
        """Events seen since the last drain, oldest first."""
        with self._lock:
            events, self._queue = self._queue, []
        return events

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (it wakes within wait_ms) and free the event set."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return  # still inside nvmlEventSetWait; freeing the set under it would be unsafe
        self._free()

    def _free(self) -> None:
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except Exception:  # noqa: BLE001 - shutting down
                pass
            self._event_set = None

    def _run(self) -> None:
        nvml = self._nvml
        timeout_code = getattr(nvml, "NVML_ERROR_TIMEOUT", 10)
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, self._wait_ms)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == timeout_code:
                    continue
                self._problem("wait", f"waiting for NVML events failed ({_err_text(exc)}); retrying")
                self._stop.wait(self._wait_ms / 1000)  # no busy loop on a persistent error
                continue
            except Exception as exc:  # noqa: BLE001
                self._problem("wait", f"waiting for NVML events failed ({_err_text(exc)}); retrying")
                self._stop.wait(self._wait_ms / 1000)
                continue
            event = self._to_event(data)
            with self._lock:
                self._queue.append(event)

    def _to_event(self, data: Any) -> Event:
        """NVML event data -> Event; the GPU is found by asking NVML for the handle's index."""
        ts = self._clock()
        try:
            index = int(self._nvml.nvmlDeviceGetIndex(data.device))
        except Exception:  # noqa: BLE001
            index = -1
        gpu = self._gpus.get(index)
        labels = {k: gpu.labels[k] for k in ("gpu", "UUID", "modelName") if k in gpu.labels} if gpu else {"gpu": str(index)}
        name = self._type_names.get(int(data.eventType), "")
        kind, what = EVENT_KINDS.get(name, ("gpu_event", f"NVML event type {int(data.eventType):#x}"))
        if kind == "xid":
            xid = int(data.eventData)
            labels["xid"] = str(xid)
            meaning = XID_MEANINGS.get(xid, "see NVIDIA's XID catalogue")
            message = f"XID {xid} on GPU {labels.get('gpu')} ({labels.get('UUID', '?')}): {meaning}"
        else:
            message = f"{what} on GPU {labels.get('gpu')} ({labels.get('UUID', '?')}), data {int(data.eventData)}"
        return Event(ts_ms=ts, instance=self._instance, kind=kind, labels=labels, message=message)

    def _problem(self, key: str, text: str) -> None:
        if key not in self.problems:
            self.problems[key] = text
            log.warning("%s", text)


def _err_text(exc: BaseException) -> str:
    """'NVML_ERROR_NOT_SUPPORTED (3)'-style text for an NVMLError, else the exception text."""
    value = getattr(exc, "value", None)
    return f"{exc} (NVML error {value})" if value is not None else f"{type(exc).__name__}: {exc}"
