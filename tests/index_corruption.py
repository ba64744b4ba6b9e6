"""Corrupt a table's real key index, for tests of ``verify_index``.

The corruption goes through the formats the engine itself uses: new index
segment files (featurelake.index), a new platform-state root referencing them
(featurelake.state) and a metadata-only commit on the branch, like
``index.rebuild`` makes. Nothing is rewritten in place, so the caches keyed by
path never serve a stale copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from featurelake import index, refs
from featurelake.state import STATE_KEY, StateWriter
from featurelake.table import Table


@dataclass
class Seg:
    """One index segment's entries: key ``k`` is in ``files[f]`` at row ``p``."""

    files: list[str]
    k: np.ndarray
    f: np.ndarray
    p: np.ndarray


def read_segments(t: Table, branch: str = "main") -> list[Seg]:
    ice = t.refresh()
    state = t._state(ice, refs.branch_head(ice.metadata, branch))
    out = []
    for seg in state.index_segments:  # read by the engine's own segment reader, whatever the file format
        loaded = index._Loaded(ice.io, seg["path"])
        out.append(Seg(list(loaded.files), *(np.array(a, copy=True) for a in (loaded.k, loaded.f, loaded.p))))
    return out


def rewrite_index(t: Table, change: Callable[[list[Seg]], list[Seg]], branch: str = "main") -> int:
    """Commit ``change(segments)`` as the branch's index; returns the new head snapshot id."""
    segments = change(read_segments(t, branch))
    ice = t.refresh()
    head = refs.branch_head(ice.metadata, branch)
    exact = index.key_is_exact(ice.schema(), t.primary_key)
    written = [
        index._write(ice.io, index.location_of(ice), s.files, s.k, s.f, s.p, exact).as_dict() for s in segments if len(s.k)
    ]
    writer = StateWriter(t._state(ice, head), ice.io, t._platform_dir(ice))
    writer.replace_index_segments(written)
    props = {STATE_KEY: writer.write(), "featurelake.operation": "test: corrupt the index"}
    tx = ice.transaction()
    tx.update_snapshot(snapshot_properties=props, branch=branch).fast_append().commit()
    return tx.commit_transaction().metadata.refs[branch].snapshot_id


def drop_entries(n: int) -> Callable[[list[Seg]], list[Seg]]:
    """Forget the first ``n`` entries of the first segment."""

    def change(segs: list[Seg]) -> list[Seg]:
        s = segs[0]
        return [Seg(s.files, s.k[n:], s.f[n:], s.p[n:])] + segs[1:]

    return change
