"""Backfill input that holds whole data files' keys in their row order, recognised without a probe.

The usual backfill reads the keys (``t.read(columns=[key])``), computes a
column and writes it back: the input then lists every key of each data file,
in that file's row order. Looking each key up in the index and sorting the
hits back into (file, position) order (``keys.find``, ``updates.located_rows``)
would only rediscover that order, and for a million keys it was about half of
the backfill's time on S3.

Instead the key index says which files can be matched wholesale: an index
segment records, per file whose keys ascend with the row position (and do not
interleave with another file's in that segment), the run of its sorted
entries holding exactly those keys (``index.key_runs``). The input is cut
into strictly ascending runs; a file's run can only lie inside one of them, at
the row where the file's first key is (a binary search), and it matches when
the input's next ``n`` keys equal the file's ``n`` keys, compared in full.
Each match is exact, because the keys compared are the file's own keys as the
index holds them (the same entries a probe would find), and a key lives in one
data file only (appends, upserts and merges refuse a key already live): a
probe would find these keys at exactly these rows. Such a file gets a dense
update file sliced from the input; every other row (other files, keys in
another order, unknown or partial files) is located by key as before, and a
repeated or null key was refused before any of this (``keys.check_keys``).

Only single integer keys (an exact index) qualify; hashed keys, segments
written before runs were recorded, and snapshots holding a data file no
segment covers (another engine's append, which may repeat a key) find nothing
here, so every row is looked up by key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from pyiceberg.io import FileIO

from featurelake import index

MAX_INPUT_RUNS = 4096  # input in more ascending runs than this is not in any scan order: no match attempted


@dataclass(frozen=True)
class WholeFile:
    """Input rows ``[start, start + rows)`` are exactly ``path``'s keys, in its row order."""

    path: str
    start: int
    rows: int


@dataclass(frozen=True)
class _Candidate:
    path: str
    start: int  # first input row
    rows: int
    segment: "index._Segment"
    first_entry: int


def whole_files(io: FileIO, segments: Sequence[dict], live_rows: Mapping[str, int], keys: np.ndarray) -> list[WholeFile]:
    """The live data files whose keys, in row order, are exactly a slice of ``keys``; in input order.

    ``segments`` are the snapshot's index segments, ``live_rows`` its data
    files with their row counts, ``keys`` the input's index keys (distinct:
    the caller has refused repeated keys). Slices never overlap; an input row
    outside every returned slice is not known to belong to a matched file.
    """
    n = len(keys)
    if n == 0 or not segments or not all(s.get("exact") for s in segments):
        return []
    if set(live_rows) - index.covered_files(io, segments):
        return []  # a file no segment covers (another engine's write) may hold any key again: probe every key
    breaks = np.flatnonzero(keys[1:] <= keys[:-1]) + 1
    if len(breaks) >= MAX_INPUT_RUNS:
        return []
    run_starts = np.concatenate([[0], breaks])
    run_ends = np.concatenate([breaks, [n]])
    run_lo, run_hi = keys[run_starts], keys[run_ends - 1]
    candidates: list[_Candidate] = []
    seen: set[str] = set()
    for seg in segments:
        opened = index._open(io, seg)
        if opened.runs is None:
            continue
        for path, (entry, count, first, last) in zip(opened.files, opened.runs):
            if entry < 0 or path in seen or live_rows.get(path) != count or count > n:
                continue
            inside = np.flatnonzero((run_lo <= first) & (run_hi >= last) & (run_ends - run_starts >= count))
            for r in inside:
                a, b = int(run_starts[r]), int(run_ends[r])
                at = a + int(np.searchsorted(keys[a:b], first))
                if at + count <= b and keys[at] == first and keys[at + count - 1] == last:
                    candidates.append(_Candidate(path, at, count, opened, entry))
                    seen.add(path)
                    break
    _prefetch(candidates)
    matched = [c for c in candidates if _same_keys(c, keys)]
    matched.sort(key=lambda c: c.start)
    for before, after in zip(matched, matched[1:]):
        if before.start + before.rows > after.start:  # two files claim one row: a key held twice in the table
            return []
    return [WholeFile(c.path, c.start, c.rows) for c in matched]


def _prefetch(candidates: Sequence[_Candidate]) -> None:
    """Read the buckets every candidate needs, one coalesced read per segment (as a probe would)."""
    needed: dict[int, tuple["index._Segment", set[int]]] = {}
    for c in candidates:
        seg = c.segment
        first = int(np.searchsorted(seg.offsets, c.first_entry, side="right")) - 1
        last = int(np.searchsorted(seg.offsets, c.first_entry + c.rows, side="left"))
        needed.setdefault(id(seg), (seg, set()))[1].update(range(first, last))
    for seg, buckets in needed.values():
        seg.read(sorted(buckets))


def _same_keys(c: _Candidate, keys: np.ndarray) -> bool:
    """Whether input rows ``[c.start, c.start + c.rows)`` hold the file's keys, compared one by one."""
    at = c.start
    for part in c.segment.keys_between(c.first_entry, c.first_entry + c.rows):
        if not np.array_equal(keys[at: at + len(part)], part):
            return False
        at += len(part)
    return at == c.start + c.rows


def uncovered_rows(total: int, matched: Sequence[WholeFile]) -> list[tuple[int, int]]:
    """The ``(start, rows)`` ranges of ``range(total)`` outside every matched slice (sorted by start)."""
    out, at = [], 0
    for m in matched:
        if m.start > at:
            out.append((at, m.start - at))
        at = m.start + m.rows
    if total > at:
        out.append((at, total - at))
    return out


__all__ = ["WholeFile", "whole_files", "uncovered_rows", "MAX_INPUT_RUNS"]
