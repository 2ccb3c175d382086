"""The demo's sidecar budget counts its own CPU, not the load threads' that share its process."""

from __future__ import annotations

import threading
import time

from vllm_sentinel.agent.demo.load_cpu import CpuLessLoad, thread_cpu_seconds


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_load_threads_cpu_is_left_out_and_stays_out_after_it_ends():
    total = [100.0]
    load = threading.Thread(target=_spin, args=(0.3,), name="traffic-0")
    other = threading.Thread(target=_spin, args=(0.3,), name="collect_0")
    reader = CpuLessLoad(read_total=lambda: total[0])
    load.start(), other.start()
    load.join(), other.join()
    # both ended before a read: nothing was seen of the load, so nothing is subtracted
    assert reader() == 100.0
    done = threading.Event()
    load = threading.Thread(target=lambda: (_spin(0.3), done.wait(10)), name="traffic-1")
    load.start()
    time.sleep(0.05)
    while not reader.load_s or max(reader.load_s.values()) < 0.2:
        reader()
        time.sleep(0.05)
    seen = sum(reader.load_s.values())
    assert 0.2 <= seen <= 1.0
    assert reader() == 100.0 - sum(reader.load_s.values())
    done.set()
    load.join()
    total[0] = 101.0  # the process's total keeps what the ended thread used: it stays subtracted
    assert reader() == 101.0 - sum(reader.load_s.values())


def test_a_thread_that_ended_reads_none():
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
    # join returns when Python is done with the thread; the kernel drops its task entry a moment later
    deadline = time.monotonic() + 5
    while thread_cpu_seconds(t.native_id) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread_cpu_seconds(t.native_id) is None
    assert thread_cpu_seconds(threading.get_native_id()) is not None
