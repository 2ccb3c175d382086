"""Label-set work remembered by the key list it was computed from.

The daemon evaluates the same rules over the same series every few seconds: grouping 700 bucket
series by their labels, checking them for duplicates or dropping their metric names gives the same
answer each time. The catalog hands out one tuple of keys per selector, operators that keep or
derive keys hand out remembered tuples too, so such answers are looked up by the tuple's identity
(no hashing of hundreds of label sets). Only tuples are remembered: they cannot change afterwards.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable

KEEP = 4096  # remembered answers; past that the memo starts over (a rule pack needs a few hundred)


class KeyMemo:
    """compute() once per (key tuple, what) while that tuple lives; a list is never remembered."""

    def __init__(self, keep: int = KEEP) -> None:
        self._memo: dict[tuple[int, Hashable], tuple[Any, Any]] = {}
        self._keep = keep
        self._lock = threading.Lock()

    def get(self, keys: Any, what: Hashable, compute: Callable[[], Any]) -> Any:
        """compute()'s answer for these keys, remembered when keys is a tuple.

        The tuple itself is held with its answer, so its id cannot be reused by another object while
        the answer is remembered.
        """
        if type(keys) is not tuple:
            return compute()
        slot = (id(keys), what)
        hit = self._memo.get(slot)
        if hit is not None and hit[0] is keys:
            return hit[1]
        value = compute()
        with self._lock:
            if len(self._memo) >= self._keep:
                self._memo.clear()
            self._memo[slot] = (keys, value)
        return value


MEMO = KeyMemo()  # shared by every engine: answers depend on the keys alone
