"""Chunk codecs of the sequence store: how one column group's events of one (user, chunk) become a value.

Split from :mod:`featurelake.sequences.store` (the key-value interface): a
build chooses a codec per column group and records it; the reader decodes
a whole batch of values at once.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from featurelake.errors import CorruptFileError, FeatureLakeError
from featurelake.sequences.strings import DictionaryStrings

# ------------------------------------------------------------ chunk codecs
#
# A chunk value holds one column group's events of one (user, chunk). Two
# encodings, chosen per group at build time and recorded in the build:
#
# * ``ipc``: an Arrow RecordBatch IPC message (any types, nested included;
#   the schema is stored once per build). Decoding costs ~5 us per message.
# * ``fixed``: for groups of fixed-width columns (ints, floats, timestamps,
#   dates, bools) and low-cardinality strings (dictionary codes, the
#   dictionary kept in the build record): every column padded to
#   ``chunk_events`` values, column after column, then one validity byte per
#   value for nullable columns. Every value of a group has the same size, so
#   a whole batch of values decodes with one ``join`` and numpy views -- no
#   per-value work. Padding is zeros, which RocksDB's compression erases.
#   Multi-byte columns are byte-shuffled (byte planes, as Blosc does) and the
#   time column is delta-coded first: zstd then stores sorted timestamps in
#   ~4.7 instead of ~6.8 bytes (measured); undoing both is a vectorized
#   transpose and cumsum over the whole batch.

DICT_MAX = 4096


def fixed_dtype(t: pa.DataType) -> np.dtype | None:
    """The numpy dtype a fixed-width Arrow type is stored as, or None."""
    if pa.types.is_boolean(t):
        return np.dtype(np.uint8)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype())
    if pa.types.is_timestamp(t) or pa.types.is_date64(t) or pa.types.is_duration(t):
        return np.dtype(np.int64)
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return np.dtype(np.int32)
    if pa.types.is_time64(t):
        return np.dtype(np.int64)
    return None


def is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


class IpcCodec:
    kind = "ipc"

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def to_dict(self) -> dict:
        return {"kind": self.kind}

    def encoder(self, tbl: pa.Table):
        """A function (offset, length) -> value over ``tbl`` (already in the group's schema)."""
        part = tbl.combine_chunks()
        batch = part.to_batches()[0] if part.num_rows else None
        return lambda off, ln: batch.slice(off, ln).serialize().to_pybytes()

    def decode(self, values: list[bytes], counts: np.ndarray, chunk_events: int) -> pa.Table:
        batches = [pa.ipc.read_record_batch(pa.py_buffer(v), self.schema) for v in values]
        return pa.Table.from_batches(batches, schema=self.schema)


class FixedCodec:
    kind = "fixed"

    def __init__(self, schema: pa.Schema, chunk_events: int, dictionaries: dict[str, list[str]],
                 delta: Sequence[str] = ()) -> None:
        self.schema = schema
        self.c = int(chunk_events)
        self.delta = [d for d in delta if d in schema.names and fixed_dtype(schema.field(d).type) is not None
                      and np.issubdtype(fixed_dtype(schema.field(d).type), np.signedinteger)]
        self.dictionaries = {k: list(v) for k, v in dictionaries.items()}
        self._dict_arrays = {k: pa.array(v, type=schema.field(k).type) for k, v in self.dictionaries.items()}
        self._strings: dict[str, DictionaryStrings] = {}
        self.layout: dict[str, tuple[int, np.dtype, int | None]] = {}  # name -> (offset, dtype, validity offset)
        off = 0
        for f in schema:
            dt = np.dtype(np.uint16) if f.name in self.dictionaries else fixed_dtype(f.type)
            if dt is None:
                raise FeatureLakeError(f"column {f.name} ({f.type}) cannot use the fixed chunk codec")
            self.layout[f.name] = (off, dt, None)
            off += self.c * dt.itemsize
        for f in schema:
            if f.nullable:
                o, dt, _ = self.layout[f.name]
                self.layout[f.name] = (o, dt, off)
                off += self.c
        self.size = off

    @classmethod
    def plan(cls, schema: pa.Schema, chunk_events: int, uniques: dict[str, list[str] | None],
             delta: Sequence[str] = ()) -> "FixedCodec | None":
        """The fixed codec for ``schema`` when every column fits (strings: at most DICT_MAX values)."""
        dicts = {}
        for f in schema:
            if is_string(f.type):
                vals = uniques.get(f.name)
                if vals is None or len(vals) > DICT_MAX:
                    return None
                dicts[f.name] = sorted(vals)
            elif fixed_dtype(f.type) is None:
                return None
        return cls(schema, chunk_events, dicts, delta)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "dictionaries": self.dictionaries, "delta": self.delta}

    def extended(self, uniques: dict[str, list[str] | None]) -> "FixedCodec | None":
        """This codec with new dictionary values appended (old codes stay valid), or None if too many."""
        dicts = {}
        for name, old in self.dictionaries.items():
            new = uniques.get(name)
            if new is None:
                return None
            known = set(old)
            merged = old + sorted(v for v in new if v not in known)
            if len(merged) > DICT_MAX:
                return None
            dicts[name] = merged
        return FixedCodec(self.schema, self.c, dicts, self.delta)

    def encoder(self, tbl: pa.Table):
        cols: list[tuple[np.ndarray, int]] = []
        valids: list[np.ndarray] = []
        for f in self.schema:
            col = tbl.column(f.name).combine_chunks()
            _, dt, voff = self.layout[f.name]
            if f.name in self.dictionaries:
                codes = pa.compute.index_in(col, value_set=self._dict_arrays[f.name])
                if codes.null_count > col.null_count:
                    raise FeatureLakeError(f"a value of {f.name} is missing from the build's dictionary")
                arr = codes.fill_null(0).to_numpy(zero_copy_only=False).astype(dt)
            else:
                filled = col.fill_null(False if pa.types.is_boolean(f.type) else 0) if col.null_count else col
                if pa.types.is_boolean(f.type):
                    filled = filled.cast(pa.uint8())
                elif not (pa.types.is_integer(f.type) or pa.types.is_floating(f.type)):
                    filled = filled.view(pa.int64() if dt.itemsize == 8 else pa.int32())
                arr = np.ascontiguousarray(filled.to_numpy(zero_copy_only=False), dtype=dt)
            cols.append((arr, dt.itemsize, f.name in self.delta))
            if voff is not None:
                valids.append(np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint8))
        c = self.c

        def encode(off: int, ln: int) -> bytes:
            parts = []
            for arr, w, delta in cols:
                x = arr[off : off + ln]
                if delta:
                    x = np.diff(x, prepend=x.dtype.type(0))
                if ln < c:
                    x = np.concatenate([x, np.zeros(c - ln, x.dtype)])
                parts.append(np.ascontiguousarray(x.view(np.uint8).reshape(c, w).T).tobytes() if w > 1 else x.tobytes())
            for v in valids:
                parts.append(v[off : off + ln].tobytes())
                if ln < c:
                    parts.append(bytes(c - ln))
            return b"".join(parts)

        return encode

    def alloc(self, names: Sequence[str], pairs: int, empty=None,
              dtypes: dict[str, np.dtype] | None = None) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """Empty padded columns for ``pairs`` values (``chunk_events`` slots each), to decode into.

        ``empty(key, n, dtype)`` replaces ``np.empty`` (a caller's reusable
        buffers); ``dtypes`` narrows columns (see :meth:`narrow_dtype`).
        """
        empty = empty or (lambda key, n, dt: np.empty(n, dt))
        dtypes = dtypes or {}
        out = {}
        for name in names:
            _, dt, voff = self.layout[name]
            dt = dtypes.get(name, dt)
            n = pairs * self.c
            # buffers keyed by column and dtype, not by codec: a lookup's columns have distinct names, and
            # every store opened (st.lookup opens one a call) reuses the same few buffers
            out[name] = (empty(("pool", name, dt.str), n, dt),
                         None if voff is None else empty(("pool-valid", name), n, np.bool_))
        return out

    def planes_used(self, grid: np.ndarray, name: str) -> int:
        """Bytes per value that column ``name`` needs in these values (1, 2, 4 or its width): the others are zero.

        Why: integer attributes are stored as byte planes of their full
        width, and ids, counts and dictionary codes rarely use the high
        bytes (zstd stores those planes in almost nothing). A batch whose
        high planes are all zero decodes, gathers and copies the narrow
        values (a quarter of the bytes for ids below 65,536 in an int64
        column) and widens them once, into the returned column. Checked on
        the values themselves, so every build qualifies and a negative value
        (high bytes set) simply keeps the full width. Delta-coded and
        non-integer columns always keep theirs.
        """
        off, dt, _ = self.layout[name]
        w = dt.itemsize
        if w == 1 or dt.kind not in "iu" or name in self.delta:
            return w
        c = self.c
        for lo in (4, 2, 1):  # anything set in planes [lo, 2 * lo)? then 2 * lo bytes are needed
            if lo < w and _any(grid[:, off + lo * c : off + min(w, 2 * lo) * c]):
                return min(w, 2 * lo)
        return 1

    def narrow_dtype(self, name: str, planes: int) -> np.dtype:
        """The dtype column ``name`` decodes into when its values need ``planes`` bytes (:meth:`planes_used`)."""
        dt = self.layout[name][1]
        return dt if planes >= dt.itemsize else np.dtype(f"u{planes}")

    def grid(self, values: list[bytes]) -> np.ndarray:
        """The values side by side as one (values, size) uint8 array (one join; sizes checked)."""
        joined = b"".join(values)
        if len(joined) != len(values) * self.size:
            raise CorruptFileError("a fixed-size sequence chunk has the wrong size (store damaged?)")
        return np.frombuffer(joined, np.uint8).reshape(len(values), self.size)

    def decode_into(self, values: list[bytes] | np.ndarray, names: Sequence[str],
                    out: dict[str, tuple[np.ndarray, np.ndarray | None]], first: int, rows: np.ndarray | None = None) -> int:
        """Decode ``values`` straight into ``out`` (from :meth:`alloc`) at value slots ``first``...

        ``values`` may also be their :meth:`grid` (decoding several column
        sets of one batch joins the values once). ``rows`` (positions into
        ``values``) decodes only those values, each into slot ``first +
        position``. Byte planes are copied plane by plane into the output's
        bytes (no intermediate array); a narrowed output column (see
        :meth:`planes_used`) takes only its low planes. Returns the bytes of
        stored values decoded, at the columns' stored widths (what the
        projection and the chunks selected cost, whatever the narrowing).
        """
        grid = values if isinstance(values, np.ndarray) else self.grid(values)
        p, c = (len(grid) if rows is None else len(rows)), self.c
        decoded = 0
        for name in names:
            off, stored, voff = self.layout[name]
            vals, valid = out[name]
            dt = vals.dtype
            w = dt.itemsize
            if rows is None:
                target = vals[first * c : (first + p) * c].reshape(p, c)
            else:
                target = np.empty((p, c), dt)
            planes = grid[:, off : off + c * w]
            if rows is not None:
                planes = planes[rows]  # only this column's planes of the rows asked for
            if w == 2:  # two planes: shift and or (2x the plane copies below, measured)
                np.left_shift(planes[:, c:], 8, out=target, dtype=dt)
                np.bitwise_or(target, planes[:, :c], out=target)
            elif w > 1:  # byte planes back to values, one plane at a time into the target's bytes
                # (for a batch part that fits in cache this beats one transposing copy 2x: measured)
                tb = target.view(np.uint8).reshape(p, c, w)
                for b in range(w):
                    tb[:, :, b] = planes[:, b * c : (b + 1) * c]
            else:
                target.view(np.uint8)[...] = planes
            if name in self.delta:
                np.cumsum(target, axis=1, dtype=dt, out=target)
            if rows is not None:
                vals.reshape(-1, c)[first + rows] = target
            decoded += p * c * stored.itemsize
            if valid is not None:
                flags = (grid[:, voff : voff + c] if rows is None else grid[rows, voff : voff + c]).view(np.bool_)
                if rows is None:
                    valid[first * c : (first + p) * c].reshape(p, c)[...] = flags
                else:
                    valid.reshape(-1, c)[first + rows] = flags
                decoded += p * c
        return decoded

    def decode_padded(self, values: list[bytes], names: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """Columns over all values, ``chunk_events`` slots per value: name -> (values, validity or None)."""
        out = self.alloc(names, len(values))
        self.decode_into(values, names, out, 0)
        return out

    def to_arrow(self, name: str, vals: np.ndarray, valid: np.ndarray | None) -> pa.Array:
        """One column from decoded values (zero-copy for fixed-width types at full width) and validity flags.

        Narrowed values (:meth:`narrow_dtype`) are widened here, in one copy;
        dictionary codes become strings through :class:`DictionaryStrings`.
        """
        f = self.schema.field(name)
        n = len(vals)
        if name in self.dictionaries:
            return self.strings(name).decode(vals, valid)
        bitmap = None
        if valid is not None and not valid.all():
            bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
        if pa.types.is_boolean(f.type):
            data = np.packbits(vals.view(np.bool_), bitorder="little")
            return pa.Array.from_buffers(pa.bool_(), n, [bitmap, pa.py_buffer(data)])
        return pa.Array.from_buffers(f.type, n, [bitmap, pa.py_buffer(np.ascontiguousarray(self.widen(name, vals)))])

    def widen(self, name: str, vals: np.ndarray) -> np.ndarray:
        """Decoded values of column ``name`` in its stored dtype (a copy only when they were narrowed)."""
        dt = self.layout[name][1]
        return vals if vals.dtype == dt else vals.astype(dt)

    def strings(self, name: str) -> DictionaryStrings:
        """The string decoder of dictionary column ``name`` (built once)."""
        got = self._strings.get(name)
        if got is None:
            got = self._strings[name] = DictionaryStrings(self._dict_arrays[name])
        return got

    def decode(self, values: list[bytes], counts: np.ndarray, chunk_events: int) -> pa.Table:
        cols = self.decode_padded(values, self.schema.names)
        keep = (np.arange(self.c)[None, :] < np.asarray(counts)[:, None]).reshape(-1)
        arrays = [self.to_arrow(n, v[keep], None if m is None else m[keep]) for n, (v, m) in cols.items()]
        return pa.Table.from_arrays(arrays, schema=self.schema)


def _any(block: np.ndarray) -> bool:
    """Whether any byte of a 2-D uint8 block is set (read as 8-byte words when its rows allow: 3x faster)."""
    if block.shape[1] % 8 == 0 and block.strides[1] == 1:
        block = block.view(np.uint64)
    return bool(block.any())


def codec_from_dict(d: dict, schema: pa.Schema, chunk_events: int):
    """The fixed or IPC codec a build recorded (``packed``: see :func:`featurelake.sequences.buildinfo.codec_of`)."""
    kind = d.get("kind", "ipc")
    if kind == "fixed":
        return FixedCodec(schema, chunk_events, d.get("dictionaries", {}), d.get("delta", ()))
    if kind != "ipc":
        raise CorruptFileError(f"unknown sequence chunk codec {kind!r} (a build written by a newer featurelake?)")
    return IpcCodec(schema)
