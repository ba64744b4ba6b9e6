"""How a sequence store lays events out: column groups, their codecs, and per-user records.

Why a module of its own: the value and key codecs (:mod:`featurelake.sequences.store`)
know how to turn one chunk of rows into bytes and back; this module decides
what those chunks are. A build's :class:`_Layout` says which attribute
columns go into which separately fetched group (group 0 also holds the time
column), with which codec (fixed-size raw chunks where the types and the
distinct string values allow, byte-planed ``packed`` chunks for groups of
fixed-width and list<fixed-width> columns, Arrow IPC otherwise), and
:func:`_encode_sorted` writes each user's events, sorted by time, as one
head value plus one value per (chunk, group).

The head is two-level for long histories, so that a lookup reads O(1)
bytes of it whatever the history's length. It holds the event count, the
last event time and then either the first time of every chunk (a user with
at most ``HEAD_FANOUT`` chunks) or the first time of every ``HEAD_FANOUT``-th
chunk; in the second case page ``p`` (tag 2) holds the first times of
chunks ``p*HEAD_FANOUT ...`` and a lookup fetches only the pages it needs.
The reader tells the two apart by comparing the head's length with the
chunk count the event count implies. At 800K events per user and 128 events
per chunk a single-level head would be 50 KB; two-level, 800 bytes plus one
512-byte page. Both the full and the incremental build
(:mod:`featurelake.sequences.build`) write through it; the reader
(:mod:`featurelake.sequences.lookup`) reads the same records back.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from featurelake.errors import FeatureLakeError, SchemaMismatchError
from featurelake.sequences.packed import PackedCodec
from featurelake.sequences.codecs import DICT_MAX, FixedCodec, IpcCodec, fixed_dtype, is_string
from featurelake.sequences.store import HEAD_FANOUT, KeyCodec

if TYPE_CHECKING:
    from featurelake.sequences.tiering import SegmentWriter


# ================================================================== layout
@dataclasses.dataclass
class _Layout:
    key: str
    time: str
    event_id: str
    synthetic: bool
    key_type: pa.DataType
    time_type: pa.DataType
    chunk_events: int
    groups: list[list[str]]          # attribute columns per group
    attributes: list[str]            # every stored attribute, in table order
    group_schemas: list[pa.Schema]   # group 0 carries the time column too (the hot group)
    codec_mode: str = "auto"         # "auto": fixed-size chunks where the types allow; "ipc": Arrow IPC everywhere

    @property
    def stored(self) -> list[str]:
        return [c for g in self.groups for c in g]

    @property
    def scan_columns(self) -> list[str]:
        extra = [self.event_id] if self.event_id not in self.stored else []
        return [self.key, self.time] + extra + self.stored

    def dictionary_columns(self) -> list[str]:
        """String columns of groups that could use the fixed codec (their distinct values are counted)."""
        if self.codec_mode != "auto":
            return []
        out = []
        for schema in self.group_schemas:
            if all(fixed_dtype(f.type) is not None or is_string(f.type) for f in schema):
                out += [f.name for f in schema if is_string(f.type)]
        return out

    def plan_codecs(self, uniques: dict[str, list[str] | None]) -> list:
        if self.codec_mode != "auto":
            return [IpcCodec(s) for s in self.group_schemas]
        return [FixedCodec.plan(s, self.chunk_events, uniques, delta=[self.time])
                or PackedCodec.plan(s, delta=[self.time]) or IpcCodec(s) for s in self.group_schemas]


def _check_groups(groups: Sequence[Sequence[str]] | None, attrs: list[str], time: str) -> list[list[str]]:
    if groups is None:
        return [list(attrs)]
    out: list[list[str]] = []
    seen: set[str] = set()
    for g in groups:
        g = [c for c in g if c != time]
        bad = [c for c in g if c not in attrs]
        if bad:
            raise SchemaMismatchError(f"column_groups name unknown attribute(s) {bad}; attributes: {attrs}", bad)
        twice = [c for c in g if c in seen]
        if twice:
            raise SchemaMismatchError(f"column_groups list {twice} more than once", twice)
        seen.update(g)
        if g:
            out.append(list(g))
    rest = [c for c in attrs if c not in seen]
    if rest or not out:
        out.append(rest)
    if len(out) > 255:
        raise FeatureLakeError("at most 255 column groups")
    return out


# ================================================================ encoding
def _int_times(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_timestamp(arr.type):
        arr = arr.cast(pa.int64())
    return arr.cast(pa.int64()).to_numpy(zero_copy_only=False)


def _uniques(tbl: pa.Table, columns: Sequence[str], into: dict[str, set | None]) -> None:
    """Add the distinct values of string ``columns`` to ``into`` (None once past DICT_MAX)."""
    for col in columns:
        seen = into.get(col, set())
        if seen is None:
            continue
        seen.update(v for v in pc.unique(tbl.column(col)).to_pylist() if v is not None)
        into[col] = seen if len(seen) <= DICT_MAX else None


def _as_lists(uniques: dict[str, set | None]) -> dict[str, list[str] | None]:
    return {k: (sorted(v) if v is not None else None) for k, v in uniques.items()}


def _encode_sorted(
    tbl: pa.Table,
    layout: _Layout,
    codecs: list,
    codec: KeyCodec,
    writer,
    prefix: dict | None = None,
    cold: "SegmentWriter | None" = None,
    hot_chunks: int = 0,
) -> dict[str, int]:
    """Write the heads and chunks of every user in ``tbl`` (sorted by key, time).

    ``prefix`` maps a user to (first chunk number, first times of the chunks
    before it): an incremental build re-encodes a user from that chunk on.
    With ``cold`` (a tiered build, :mod:`featurelake.sequences.tiering`) a
    user's chunks before its newest ``hot_chunks`` go to cold segments and
    the store keeps a pointer (tag 3) for each.
    """
    n = tbl.num_rows
    if n == 0:
        return {"users": 0, "events": 0, "chunks": 0}
    c = layout.chunk_events
    keys = codec.values(tbl.column(layout.key).combine_chunks())
    times = _int_times(tbl.column(layout.time))
    starts = np.concatenate([[0], np.flatnonzero(keys[1:] != keys[:-1]) + 1, [n]])
    encoders = [cd.encoder(tbl.select(schema.names).cast(schema)) for cd, schema in zip(codecs, layout.group_schemas)]
    users = events = chunks = 0
    for i in range(len(starts) - 1):
        s, e = int(starts[i]), int(starts[i + 1])
        user = keys[s]
        k0, ft_prefix = (prefix or {}).get(user if codec.kind == "string" else int(user), (0, None))
        count = -(-(e - s) // c)
        ft = times[s:e:c][:count]
        if ft_prefix is not None and len(ft_prefix):
            ft = np.concatenate([ft_prefix, ft])
        total = k0 + count
        p = codec.prefix(user)
        # Keys must come in order: head (tag 0), chunks (tag 1), head pages (tag 2).
        top = ft if total <= HEAD_FANOUT else ft[::HEAD_FANOUT]
        writer.put(p + b"\x00", np.concatenate([[k0 * c + (e - s), times[e - 1]], top]).astype("<i8").tobytes())
        first_hot = total - hot_chunks if cold is not None else 0
        pointers = []
        for j in range(count):
            off = s + j * c
            ln = min(c, e - off)
            cn = (k0 + j).to_bytes(4, "big")
            if k0 + j < first_hot:
                for g, enc in enumerate(encoders):
                    cold.add(enc(off, ln))
                    pointers.append(cn + bytes([g]))
                continue
            ck = p + b"\x01" + cn
            for g, enc in enumerate(encoders):
                writer.put(ck + bytes([g]), enc(off, ln))
        if total > HEAD_FANOUT:
            # pages before the one holding chunk k0 are unchanged (an incremental build's older layers keep them)
            ft8 = ft.astype("<i8")
            for pg in range(k0 // HEAD_FANOUT, -(-total // HEAD_FANOUT)):
                writer.put(p + b"\x02" + pg.to_bytes(4, "big"), ft8[pg * HEAD_FANOUT : (pg + 1) * HEAD_FANOUT].tobytes())
        if pointers:  # tag 3 sorts after the pages
            for tail, ptr in zip(pointers, cold.end_user()):
                writer.put(p + b"\x03" + tail, ptr)
        users += 1
        events += k0 * c + (e - s)
        chunks += k0 + count
    return {"users": users, "events": events, "chunks": chunks}


def _sort_events(tbl: pa.Table, layout: _Layout) -> pa.Table:
    return tbl.sort_by([(layout.key, "ascending"), (layout.time, "ascending"), (layout.event_id, "ascending")])


def _dropped(layout: _Layout) -> list[str]:
    return [layout.event_id] if layout.event_id not in layout.stored else []
