"""The series catalog: grown from new ids as a full load would be, shared by a store's engines, never changed under one."""

from __future__ import annotations

from vllm_sentinel.agent.promql.catalog import Catalogs, shared_catalogs
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.base import Batch


def _write(store: Store, t_ms: int, engines: int) -> None:
    b = Batch(instance="10.0.0.1:8000", ts_ms=t_ms)
    for e in range(engines):
        b.add("vllm:num_requests_running", {"engine": str(e)}, float(e))
        b.add("vllm:num_requests_waiting", {"engine": str(e)}, 1.0)
    store.append_many([b])


def test_a_grown_catalog_equals_a_full_load_and_the_old_one_stays_as_it_was():
    store = Store.open(":memory:")
    _write(store, 1_000, 2)
    grown = Catalogs()
    before = grown.current(store.cursor())
    picked = before.select([("__name__", "=", "vllm:num_requests_running")])
    _write(store, 2_000, 4)  # two engines more: four new series
    after = grown.current(store.cursor())
    assert after is not before
    assert (before.sids, len(picked)) == ([0, 1, 2, 3], 2)  # what a running query holds is unchanged
    full = Catalogs().current(store.cursor())
    assert (after.sids, after.labels) == (full.sids, full.labels)
    for matchers in ([("__name__", "=", "vllm:num_requests_running")], [("engine", "=~", "[13]")],
                     [("__name__", "=", "vllm:num_requests_waiting"), ("engine", "!=", "0")]):
        assert [after.labels[i] for i in after.select(matchers)] == [full.labels[i] for i in full.select(matchers)]
    assert after.keys(after.select([("engine", "=", "3")]), keep_name=False) == (
        (("engine", "3"), ("instance", "10.0.0.1:8000")),) * 2


def test_engines_over_one_store_share_its_catalog_and_see_new_series():
    store = Store.open(":memory:")
    _write(store, 1_000, 2)
    assert shared_catalogs(store) is shared_catalogs(store)
    a, b = Engine(store), Engine(store)
    assert len(a.instant("vllm:num_requests_running", 1_000)) == 2
    loaded = shared_catalogs(store).current(store.cursor())
    assert len(b.instant("vllm:num_requests_waiting", 1_000)) == 2
    assert shared_catalogs(store).current(store.cursor()) is loaded  # b did not load it again
    _write(store, 2_000, 3)
    assert len(b.instant("vllm:num_requests_running", 2_000)) == 3


def test_a_file_opened_read_only_asks_its_series_table_once_and_a_writers_reader_keeps_asking(tmp_path, monkeypatch):
    """No writer can touch a file open read-only, so its catalog is loaded once per process; a reader()
    view of the daemon's writable store is read-only too, but its writer goes on adding series."""
    from vllm_sentinel.agent.store import series_table
    asked = []
    real = series_table.series_version
    monkeypatch.setattr(series_table, "series_version", lambda cur: asked.append(1) or real(cur))
    path = tmp_path / "s.duckdb"
    with Store.open(path) as writer:
        _write(writer, 1_000, 2)
        view = Engine(writer.reader())
        assert len(view.instant("vllm:num_requests_running", 1_000)) == 2
        _write(writer, 2_000, 3)
        assert len(view.instant("vllm:num_requests_running", 2_000)) == 3
    assert len(asked) == 2
    asked.clear()
    with Store.open(path, read_only=True) as store:
        engine = Engine(store)
        for t in (1_000, 2_000, 2_000):
            engine.instant("vllm:num_requests_waiting", t)
        assert len(Engine(store).instant("vllm:num_requests_running", 2_000)) == 3
    assert len(asked) == 1
