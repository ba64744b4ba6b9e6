"""A small thread-safe LRU map: the one bounded in-process cache every module uses.

Why not ``functools.lru_cache``: the caches here are keyed by values computed
at the call site (paths with sizes, snapshot ids, FileIO properties), filled
from several places (a writer caches what it wrote), and cleared as a whole
(``clear_caches`` in tests and after damage).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any


class LRU:
    """At most ``size`` entries; reading or writing an entry makes it the newest."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[Any, Any] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: Any) -> Any:
        """The value under ``key`` (None when absent)."""
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        return None

    def put(self, key: Any, value: Any) -> None:
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)
            self._trim()

    def put_first(self, key: Any, value: Any) -> Any:
        """Store ``value`` unless another thread stored one first; return the one kept."""
        with self.lock:
            kept = self.items.setdefault(key, value)
            self.items.move_to_end(key)
            self._trim()
            return kept

    def clear(self) -> None:
        with self.lock:
            self.items.clear()

    def _trim(self) -> None:
        while len(self.items) > self.size:
            self.items.popitem(last=False)
