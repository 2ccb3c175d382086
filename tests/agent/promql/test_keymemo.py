"""Label-set work is remembered per key tuple, never for a list, and never across two equal tuples."""

from __future__ import annotations

from vllm_sentinel.agent.promql.keymemo import KeyMemo


def _counting():
    calls = []

    def compute(keys):
        calls.append(keys)
        return len(keys)
    return calls, compute


def test_a_tuple_is_computed_once_a_list_every_time():
    memo = KeyMemo()
    calls, compute = _counting()
    keys = ((("instance", "a"),), (("instance", "b"),))
    assert memo.get(keys, "n", lambda: compute(keys)) == 2
    assert memo.get(keys, "n", lambda: compute(keys)) == 2
    assert len(calls) == 1
    assert memo.get(keys, "other", lambda: compute(keys)) == 2  # another question about the same keys
    as_list = list(keys)
    memo.get(as_list, "n", lambda: compute(as_list))
    memo.get(as_list, "n", lambda: compute(as_list))
    assert len(calls) == 4


def test_an_equal_tuple_built_again_is_its_own_entry_and_a_full_memo_starts_over():
    memo = KeyMemo(keep=2)
    calls, compute = _counting()
    first = tuple([(("instance", "a"),)])
    second = tuple([(("instance", "a"),)])
    assert first == second and first is not second
    memo.get(first, "n", lambda: compute(first))
    memo.get(second, "n", lambda: compute(second))
    assert len(calls) == 2
    third = ((("instance", "c"),),)
    memo.get(third, "n", lambda: compute(third))  # over `keep`: the memo is cleared, then holds this one
    memo.get(first, "n", lambda: compute(first))
    assert len(calls) == 4
