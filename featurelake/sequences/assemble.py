"""A lookup's output: each row's events copied out of the fetched chunks into Arrow columns.

Part of :class:`featurelake.sequences.lookup.SequenceStore`'s lookup: after the
multi-get and the cut (which events ``[lo, hi)`` each row keeps), the rows'
events are copied back to back per column by the compiled kernels
(:mod:`featurelake.sequences.kernels`), in pieces side by side on the
store's pool when there are enough of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from featurelake.errors import CorruptFileError, FeatureLakeError
from featurelake.sequences.codecs import FixedCodec
from featurelake.sequences.gather import lookup_pool
from featurelake.sequences.gather import ranges as _ranges
from featurelake.sequences.kernels import dictionary_words, kernels

if TYPE_CHECKING:
    from featurelake.sequences.lookup import SequenceStore

PARALLEL_EVENTS = 1 << 16    # below this many events a lookup assembles its columns in the calling thread:
                             # handing work to a pool thread costs more than it saves (GIL hand-over)


def assemble(store: "SequenceStore", columns: list[str], fetched: dict[int, Any], pool_events: int, lo: np.ndarray,
         delta: np.ndarray, lengths: np.ndarray, offsets: np.ndarray, threads: int) -> list[pa.Array]:
    """Each row's events ``[lo, hi)`` copied out back to back, per column, by the compiled kernels.

    A row's events are contiguous in the fetched pool (its pairs are one
    user's consecutive chunks). Fixed-codec columns are copied by
    :mod:`featurelake.sequences.kernels` (narrowed pools widened in the
    copy); dictionary codes are written straight as string offsets and
    bytes (one pass to size each piece's bytes, one to write them; strings
    of at most 8 bytes in a single piece: one pass). With
    ``threads`` > 1 and enough events, row ranges are copied in pieces
    side by side (the kernels hold no GIL); IPC-codec columns are taken
    by Arrow, per piece.
    """
    k = kernels()
    fixed = {col: isinstance(store.codecs[store.group_of[col]], FixedCodec) for col in columns}
    total = int(offsets[-1])
    out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    src: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for col in columns:
        if fixed[col]:
            cd = store.codecs[store.group_of[col]]
            vals, ok = fetched[store.group_of[col]][col]
            if ok is not None and np.count_nonzero(ok) == pool_events:
                ok = None  # every fetched event is valid (padding slots are the only zeros): no validity to gather
            src[col] = (vals, ok)
            dt = cd.layout[col][1]
            if col in cd.dictionaries:  # strings: their offsets
                dt = np.dtype(np.int64 if pa.types.is_large_string(store._field(col).type) else np.int32)
            out[col] = (np.empty(total + (col in cd.dictionaries), dt), None if ok is None else np.empty(total, np.bool_))
    pieces = 1 if threads <= 1 or total < PARALLEL_EVENTS else threads
    bounds = np.searchsorted(offsets, np.linspace(0, total, pieces + 1)[1:-1])
    cuts = [0, *bounds.tolist(), len(lengths)]
    src_fixed = lo + delta
    spans = [(r0, r1) for r0, r1 in zip(cuts[:-1], cuts[1:]) if offsets[r1] > offsets[r0]]
    no_flags = np.zeros(0, np.bool_)
    # strings of at most 8 bytes written whole by one thread, without sizing them first (strings8_unsized), into 8
    # bytes an event (int32 offsets: while those stay below 2**31): where rows are copied in one piece, or where other
    # columns' pieces keep the other threads busy meanwhile (one round, no sizing pass: see unsized_whole)
    unsized = {col for col in columns if fixed[col] and col in store.codecs[store.group_of[col]].dictionaries
               and (len(spans) == 1 or len(columns) > 1) and dictionary_bytes(store, col)[1].shape[1] == 1
               and (pa.types.is_large_string(store._field(col).type) or 8 * total < 1 << 31)}
    if len(unsized) == len(columns) and len(spans) > 1:
        unsized = set()  # nothing else to copy meanwhile: the strings are sized and written in pieces side by side

    def piece(r: tuple[int, int]) -> dict[str, Any]:
        """Round one of a piece of rows: fixed columns copied, strings sized, IPC columns taken."""
        r0, r1 = r
        a, b = int(offsets[r0]), int(offsets[r1])
        starts, lens = src_fixed[r0:r1], lengths[r0:r1]
        got: dict[str, Any] = {}
        events = None
        for col in columns:
            g = store.group_of[col]
            if fixed[col]:
                vals, ok = src[col]
                ov, oo = out[col]
                if ok is not None:
                    k.gather(ok, starts, lens, oo[a:b])
                if col in unsized:
                    pass  # sized as written, in round two
                elif col in store.codecs[g].dictionaries:
                    nbytes = k.string_bytes(vals, no_flags if ok is None else ok, starts, lens, dictionary_bytes(store, col)[0])
                    if nbytes < 0:
                        _bad_code(store, col)
                    got[col] = nbytes
                else:
                    k.gather(vals, starts, lens, ov[a:b])
            else:
                if events is None:
                    events = pa.array(_ranges(lo[r0:r1], lengths[r0:r1], b - a))
                got[col] = fetched[g].column(col).take(events).combine_chunks()
        return got

    data: dict[str, tuple[np.ndarray, list[int]]] = {}

    def unsized_whole(col: str) -> None:
        """Every row's strings of ``col`` (at most 8 bytes each) written in one pass, unsized: one task.

        Why: sizing the strings is a pass over their codes of its own, and
        pieces written side by side need it (each piece's bytes start where
        the previous piece's end), then a second round on the pool. Next to
        other columns' pieces, one thread writing the strings whole while the
        others copy those columns took less time and CPU (measured, 4 threads
        on 2 cores: see the commit).
        """
        vals, ok = src[col]
        lens, words = dictionary_bytes(store, col)
        buf = np.empty(8 * total, np.uint8)
        end = k.strings8_unsized(vals, no_flags if ok is None else ok, src_fixed, lengths, lens, words, 0,
                                 out[col][0][:total], buf)
        if end < 0:
            _bad_code(store, col)
        out[col][0][total] = end
        # (the bytes past the end stay allocated with the column unless they are most of the buffer)
        data[col] = (buf[:end] if 2 * end >= len(buf) else buf[:end].copy(), [0, end])

    def run(fn, items: list) -> list:  # on the pool only where rows are copied in pieces (enough events)
        return list(lookup_pool(threads).map(fn, items)) if len(spans) > 1 else [fn(x) for x in items]

    # round one: the unsized strings first (each the longest task), then the pieces
    tasks = [(unsized_whole, col) for col in columns if col in unsized] + [(piece, r) for r in spans]
    parts = [p for p in run(lambda t: t[0](t[1]), tasks) if p is not None]
    strings = [col for col in columns if fixed[col] and col in store.codecs[store.group_of[col]].dictionaries
               and col not in unsized]
    for col in strings:
        sizes = [p[col] for p in parts]
        bases = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        if pa.types.is_string(store._field(col).type) and bases[-1] >= 1 << 31:
            raise FeatureLakeError(f"a lookup returned more than 2**31 bytes of {col}: use smaller batches or max_len")
        data[col] = (np.empty(int(bases[-1]), np.uint8), bases.tolist())
        out[col][0][total] = bases[-1]

    def fill(i: int) -> None:
        """Round two of piece ``i``: its strings' offsets and bytes, from its base on."""
        r0, r1 = spans[i]
        a, b = int(offsets[r0]), int(offsets[r1])
        for col in strings:
            vals, ok = src[col]
            lens, words = dictionary_bytes(store, col)
            buf, bases = data[col]
            fn = k.strings8 if words.shape[1] == 1 else k.strings  # strings of up to 8 bytes: one store each
            fn(vals, no_flags if ok is None else ok, src_fixed[r0:r1], lengths[r0:r1], lens, words, bases[i],
               bases[i + 1], out[col][0][a:b], buf)

    if strings:
        run(fill, list(range(len(spans))))
    arrays = []
    for col in columns:
        if col in data:
            ov, oo = out[col]
            t = store._field(col).type
            bitmap = None if oo is None or oo.all() else pa.py_buffer(np.packbits(oo, bitorder="little"))
            arrays.append(pa.Array.from_buffers(t, total, [bitmap, pa.py_buffer(ov), pa.py_buffer(data[col][0])]))
        elif col in out:
            vals, ok = out[col]
            arrays.append(store.codecs[store.group_of[col]].to_arrow(col, vals, ok))
        else:
            got = [p[col] for p in parts if col in p]
            arrays.append(got[0] if len(got) == 1 else pa.concat_arrays(got))
    return arrays


def _bad_code(store: "SequenceStore", col: str) -> None:
    raise CorruptFileError(f"a chunk of {col} holds a code outside the build's dictionary (build {store.info.build_id})",
                           store.info.db_dir)


def dictionary_bytes(store: "SequenceStore", col: str) -> tuple[np.ndarray, np.ndarray]:
    """Dictionary column ``col``'s strings for the string kernel: (UTF-8 length, 8-byte words) per code."""
    got = store._dicts.get(col)
    if got is None:
        got = store._dicts[col] = dictionary_words(store.codecs[store.group_of[col]].dictionaries[col])
    return got
