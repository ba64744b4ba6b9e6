"""PyTorch: an ``IterableDataset`` over :class:`featurelake.training.TrainingReader`.

Why: a training job wants tensors from a ``DataLoader`` under
``torch.distributed``, resumable with ``torchdata.stateful_dataloader``. The
sharding, shuffle, sampling and resume logic all live in the framework-free
reader; this module only places each copy of the dataset (rank from
``torch.distributed``, worker from ``get_worker_info()``) and converts Arrow
batches to tensors.

The dataset yields whole batches (dicts of tensors), so the loader takes
``batch_size=None``. ``num_workers=0`` is the fast default: the reader decodes
and shuffles on its own threads, and a worker process would add a hand-over
per batch (a shared-memory segment passed over a socket) that costs the
training process more than reading the batch (``benchmarks/training.py``
measures both). With workers, each copy reads its share of the rows. A
batch's numeric tensors are views of one buffer, so it crosses from a worker
as one segment, not one per column (3.6x the loader's rows/s with 9
columns), and moves to a GPU in one copy. Columns convert as:

* numbers and booleans: a 1-D tensor (nulls become NaN for floats, 0 for
  integers and booleans); timestamps: int64 microseconds;
* lists of numbers (``lists="padded"``, the default): ``name`` as a
  ``[batch, longest]`` tensor padded with ``pad_value`` and ``name_lengths``;
  ``lists="jagged"``: ``name_values`` (all elements) and ``name_offsets``
  (``batch + 1`` entries), the layout ``nn.EmbeddingBag`` takes;
* lists of structs (sequence joins): one such tensor per struct field,
  ``name_field``, sharing ``name_lengths`` or ``name_offsets``;
* list views (``SequenceTable.view(layout="list_view")``): as the lists
  they view, each row's elements copied from where its offset points (the
  views are never gathered into a list first), so numeric tensors match
  the ``list`` layout's;
* dictionary-coded values (a list view's string fields): their codes, int32
  (int64 for wider indices), ready for ``nn.Embedding``. They index the
  Arrow column's dictionary; a sequence store's is the build's, and a build
  that appends new strings keeps the old codes;
* structs: one entry per field, ``name_field``;
* strings and anything else: a Python list.

:func:`to_device` moves such a batch to a GPU in one host-to-device copy
when its tensors share one buffer (as a loader worker's batches do), not
one small copy per column.

torch is the optional extra ``featurelake[torch]``; importing this module
without it raises ImportError naming the extra.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("featurelake.torch needs PyTorch: pip install 'featurelake[torch]'") from e

from featurelake.errors import FeatureLakeError
from featurelake.training import TrainingReader

LIST_MODES = ("padded", "jagged")


class TrainingDataset(IterableDataset):
    """Batches of a :class:`TrainingReader` as dicts of tensors, sharded over ranks and workers.

    Pass a table and the reader's keyword arguments, or a ready reader. The
    rank and world size default to ``torch.distributed``'s when it is
    initialized. Follows the stateful-dataloader protocol (``state_dict`` /
    ``load_state_dict``); call ``set_epoch`` at the start of each epoch.
    """

    def __init__(self, source: Any, lists: str = "padded", pad_value: int | float = 0, **reader_kwargs: Any) -> None:
        if lists not in LIST_MODES:
            raise FeatureLakeError(f"lists must be one of {LIST_MODES}, got {lists!r}")
        if isinstance(source, TrainingReader):
            if reader_kwargs:
                raise FeatureLakeError(f"reader options {sorted(reader_kwargs)} apply to a table, not to a ready reader")
            self.reader = source
        else:
            if "rank" not in reader_kwargs and "world_size" not in reader_kwargs:
                reader_kwargs["rank"], reader_kwargs["world_size"] = _distributed()
            self.reader = TrainingReader(source, **reader_kwargs)
        self.lists = lists
        self.pad_value = pad_value
        _load_kernels(self.reader, lists, pad_value)

    def _place(self) -> None:
        info = get_worker_info()
        if info is None:
            self.reader.set_worker(0, 1)
        else:
            self.reader.set_worker(info.id, info.num_workers)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._place()
        in_worker = get_worker_info() is not None
        for batch in self.reader:
            tensors = to_tensors(batch, self.lists, self.pad_value)
            yield _one_storage(tensors) if in_worker else tensors

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a new shuffle) in every worker created after this call."""
        self.reader.set_epoch(epoch)

    def stats(self) -> Any:
        """This copy's :class:`featurelake.training.ReadStats` (with ``num_workers=0``, the loader's; a loader
        worker's copy keeps its own)."""
        return self.reader.stats()

    def state_dict(self) -> dict[str, Any]:
        """This copy's reader position (in a loader worker: that worker's)."""
        return self.reader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._place()
        self.reader.load_state_dict(state)


def _load_kernels(reader: TrainingReader, lists: str, pad_value: int | float) -> None:
    """Load the compiled row copies the reader's padded list columns will use, now (numba's cache: ~0.1 s a type).

    Data-loader workers forked from this process then inherit them instead
    of each loading them again at the start of every epoch (the reader loads
    the shuffle's kernel for the same reason).
    """
    if lists != "padded":
        return
    fields = list(reader.scan.output_schema) + [pa.field(name, v.type) for name, v in reader.sequences.items()]
    types = [t for f in fields for t in _padded_element_types(f.type)]
    empty = np.empty(0, np.int64)
    for t in dict.fromkeys(types):
        dtype = _plain_dtype(t)
        if dtype is None:
            continue
        found = _raw(pa.array([], t))
        values = found[0] if found is not None else _values(pa.array([], t), pad_value)
        pad = np.full(1, pad_value, dtype)
        _pad_rows()(values, empty, empty, pad, np.empty((0, 0), dtype))
        if found is not None:
            _pad_rows_nullable()(values, np.empty(0, np.uint8), 0, empty, empty, pad, pad, np.empty((0, 0), dtype))


def _padded_element_types(t: pa.DataType) -> list[pa.DataType]:
    """The element types of the list columns (inside structs too) that :func:`_pad` copies."""
    if pa.types.is_struct(t):
        return [e for i in range(t.num_fields) for e in _padded_element_types(t.field(i).type)]
    if _is_list(t):
        v = t.value_type
        return [v.field(i).type for i in range(v.num_fields)] if pa.types.is_struct(v) else [v]
    return []


def _one_storage(tensors: dict[str, Any]) -> dict[str, Any]:
    """The batch's tensors as views of one shared buffer.

    A loader worker hands each storage to the main process through its own
    shared-memory segment (a file descriptor sent over a socket): with a dozen
    columns that costs far more than reading the batch. Views of one buffer
    travel as one segment.
    """
    items = [(k, v) for k, v in tensors.items() if isinstance(v, torch.Tensor) and v.numel()]
    if len(items) < 2 or len({v.untyped_storage().data_ptr() for _, v in items}) == 1:
        return tensors  # at most one storage already (plain numeric columns: see to_tensors)
    offsets, total = [], 0
    for _, v in items:
        total = -(-total // 8) * 8  # every view starts 8-byte aligned
        offsets.append(total)
        total += v.numel() * v.element_size()
    buffer = torch.empty(total, dtype=torch.uint8)
    out = dict(tensors)
    for (k, v), start in zip(items, offsets):
        view = buffer[start : start + v.numel() * v.element_size()].view(v.dtype).view(v.shape)
        view.copy_(v)
        out[k] = view
    return out


def to_device(batch: Mapping[str, Any], device: Any, non_blocking: bool = True, pin: bool = False) -> dict[str, Any]:
    """The batch with its tensors on ``device``; other values (Python lists of strings) unchanged.

    When the tensors are contiguous views of one storage (a ``DataLoader``
    worker's batches, see ``_one_storage``) the storage crosses in one copy and
    the tensors come back as views of it; otherwise each tensor is copied.
    ``pin`` first copies that storage to page-locked memory, so a
    ``non_blocking`` copy overlaps the next step (``DataLoader(pin_memory=True)``
    would pin each column on its own instead).
    """
    device = torch.device(device)
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    out = dict(batch)
    storages = {v.untyped_storage().data_ptr() for v in tensors.values()}
    if len(tensors) < 2 or len(storages) != 1 or not all(v.is_contiguous() for v in tensors.values()):
        out.update({k: v.to(device, non_blocking=non_blocking) for k, v in tensors.items()})
        return out
    storage = next(iter(tensors.values())).untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8).set_(storage)
    if pin and device.type != "cpu":
        flat = flat.pin_memory()
    moved = flat.to(device, non_blocking=non_blocking)
    for k, v in tensors.items():
        start = v.storage_offset() * v.element_size()
        out[k] = moved[start : start + v.numel() * v.element_size()].view(v.dtype).view(v.shape)
    return out


def _distributed() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def to_tensors(batch: pa.RecordBatch, lists: str = "padded", pad_value: int | float = 0) -> dict[str, Any]:
    """One Arrow batch as a dict of tensors (see the module docstring for the layout).

    The plain numeric columns (one value per row) are copied straight into
    views of one buffer: one copy per column, and a batch that a loader worker
    sends or :func:`to_device` moves as one storage. Tensors never share memory
    with the Arrow batch, so changing one in place cannot change the data read.
    """
    plan = _plan(batch.schema)
    out: dict[str, Any] = {}
    n = batch.num_rows
    plain: list[tuple[str, pa.Array, np.dtype, bool, int]] = []
    sizes: list[int] = []
    for i, (name, dtype, direct) in enumerate(plan):
        col = batch.column(i)
        if dtype is None:
            _convert(out, name, col, lists, pad_value)
            continue
        out[name] = None  # keeps the column order; filled below
        nbytes = n * dtype.itemsize
        plain.append((name, col, dtype, direct, len(sizes)))
        sizes.append(nbytes)
        if nbytes % 8:
            sizes.append(8 - nbytes % 8)  # every view starts 8-byte aligned
    if len(plain) == 1 or not n:  # nothing to share a buffer with (zero-length views cannot change dtype)
        for name, col, _, _, _ in plain:
            out[name] = torch.from_numpy(_numpy(col, pad_value))
    elif plain:
        buffer = np.empty(sum(sizes), np.uint8)
        views = torch.split(torch.from_numpy(buffer), sizes)  # views of one storage
        start = 0
        for name, col, dtype, direct, k in plain:
            nbytes = sizes[k]
            target = buffer[start : start + nbytes].view(dtype)
            if direct and not col.null_count:
                target[:] = np.frombuffer(col.buffers()[1], dtype=dtype, count=n, offset=col.offset * dtype.itemsize)
            else:
                target[:] = _values(col, pad_value)
            out[name] = views[k].view(_TORCH_DTYPES[dtype])
            start += nbytes + (-nbytes % 8)
    return out


# numpy dtype -> torch dtype of the plain columns (unsigned 16-64 bit integers only in newer torch releases)
_TORCH_DTYPES = {np.dtype(k): v for k, v in (
    (np.bool_, torch.bool), (np.int8, torch.int8), (np.uint8, torch.uint8), (np.int16, torch.int16),
    (np.int32, torch.int32), (np.int64, torch.int64), (np.float32, torch.float32), (np.float64, torch.float64),
)} | {np.dtype(k): getattr(torch, k) for k in ("uint16", "uint32", "uint64") if hasattr(torch, k)}
_PLANS: list[tuple[pa.Schema, list[tuple[str, np.dtype | None, bool]]]] = []  # the last schemas converted


def _plan(schema: pa.Schema) -> list[tuple[str, np.dtype | None, bool]]:
    """Per column: its name, its plain dtype (None: converted by :func:`_convert`), and whether the
    values can be viewed straight from its data buffer when it has no nulls. Kept for the last few
    schemas (a reader's batches share one, and comparing equal schemas is a pointer check)."""
    for known, plan in _PLANS:
        if known == schema:
            return plan
    plan = []
    for field in schema:
        dtype = _plain_dtype(field.type)
        direct = dtype is not None and not pa.types.is_temporal(field.type) and not pa.types.is_boolean(field.type) \
            and not pa.types.is_dictionary(field.type) and dtype.itemsize == field.type.byte_width
        plan.append((field.name, dtype, direct))
    _PLANS.insert(0, (schema, plan))
    del _PLANS[4:]
    return plan


def _plain_dtype(t: pa.DataType) -> np.dtype | None:
    """The numpy dtype a one-value-per-row numeric column becomes (see :func:`_numpy`); None for the others."""
    if pa.types.is_dictionary(t):
        return np.dtype(np.int64 if t.index_type.bit_width > 32 or t.index_type == pa.uint32() else np.int32)
    if pa.types.is_temporal(t):
        return np.dtype(np.int64)
    if pa.types.is_float16(t):
        return np.dtype(np.float32)
    if pa.types.is_boolean(t):
        return np.dtype(np.bool_)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        dtype = np.dtype(t.to_pandas_dtype())
        return dtype if dtype in _TORCH_DTYPES else None
    return None


def _convert(out: dict[str, Any], name: str, col: pa.Array, lists: str, pad_value: int | float) -> None:
    t = col.type
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            _convert(out, f"{name}_{t.field(i).name}", col.field(i), lists, pad_value)
        return
    if _is_list(t):
        if not all(_numeric(v.type) for v in _element_fields(name, col.values).values()):
            from featurelake.sequences.listview import as_list

            out[name] = as_list(col).to_pylist()
        elif lists == "padded":
            _pad(out, name, col, pad_value)
        else:
            _jagged(out, name, col, pad_value)
        return
    if pa.types.is_fixed_size_list(t) and _numeric(t.value_type):
        flat = _numpy(col.flatten(), pad_value)
        out[name] = torch.from_numpy(flat.reshape(len(col), t.list_size))
        return
    if _numeric(t):
        out[name] = torch.from_numpy(_numpy(col, pad_value))
        return
    out[name] = col.to_pylist()


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)


def _extents(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Each row's first element in ``col.values`` and its number of elements (0 for a null list), for lists
    and list views alike (a list view's rows may overlap, skip values or come in any order)."""
    lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy().astype(np.int64)
    offsets = col.offsets.to_numpy().astype(np.int64)  # into col.values (the slice's, not rebased)
    return (offsets if len(offsets) == len(col) else offsets[:-1]), lengths  # a list view's n, or a list's n + 1


def _jagged(out: dict[str, Any], name: str, col: pa.Array, pad_value: int | float) -> None:
    """``name_offsets`` (rows + 1) and ``name_values`` (or ``name_field_values``): every row's elements in order."""
    starts, lengths = _extents(col)
    ends = np.cumsum(lengths)
    out[f"{name}_offsets"] = torch.from_numpy(np.concatenate([[0], ends]).astype(np.int64))
    for key, v in _element_fields(name, col.values).items():
        flat = _batch_values(v, starts, lengths, ends, pad_value, in_place=False)[0]
        out[f"{key}_values"] = torch.from_numpy(flat if flat.flags.writeable and flat.flags.owndata else np.array(flat))


def _batch_values(values: pa.Array, starts: np.ndarray, lengths: np.ndarray, ends: np.ndarray,
                  pad_value: int | float, in_place: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The rows' elements of one field as numpy (see :func:`_values`) and where each row starts in it.

    Only the rows' elements are converted, never the whole of ``values``: a
    cached list view's values are its history arena, far larger than a batch.
    ``in_place``: fixed-width values without nulls are returned where they lie
    (zero-copy, the starts the rows' own); otherwise the rows' elements come
    out in row order, each row starting where the one before it ends.
    """
    found = _raw(values)
    raw = None if found is None else found[0]
    if raw is not None and in_place:
        return raw, starts
    total = int(ends[-1]) if len(ends) else 0
    first = int(starts[0]) if len(starts) else 0
    idx = None
    if not (len(starts) < 2 or bool(np.all(starts[1:] == starts[:-1] + lengths[:-1]))):  # not a list's usual layout
        idx = np.repeat(starts - (ends - lengths), lengths) + np.arange(total)
    if raw is not None:
        flat = raw[first : first + total] if idx is None else raw[idx]
    else:
        flat = _values(values.slice(first, total) if idx is None else values.take(pa.array(idx)), pad_value)
    return flat, ends - lengths


def _raw(arr: pa.Array, nulls: bool = False) -> tuple[np.ndarray, np.ndarray | None, int] | None:
    """A fixed-width array's values where they lie (a dictionary's codes, a time's int64), as numpy, with its
    validity bitmap (bytes, or None when no value is null) and the bitmap's first bit; None for booleans,
    half floats, and (unless ``nulls``) arrays with nulls: those go through :func:`_values`."""
    if isinstance(arr, pa.ChunkedArray) or (arr.null_count and not nulls):
        return None
    t = arr.type
    data = arr.indices if pa.types.is_dictionary(t) else arr
    dt = data.type
    if pa.types.is_temporal(dt) and dt.bit_width == 64:
        dtype = np.dtype(np.int64)
    elif (pa.types.is_integer(dt) or pa.types.is_floating(dt)) and not pa.types.is_float16(dt):
        dtype = np.dtype(dt.to_pandas_dtype())
    else:
        return None
    validity, values = data.buffers()[:2]
    bitmap = np.frombuffer(validity, np.uint8) if data.null_count and validity is not None else None
    return np.frombuffer(values, dtype=dtype, count=len(data), offset=data.offset * dtype.itemsize), bitmap, data.offset


def _element_fields(name: str, values: pa.Array) -> dict[str, pa.Array]:
    """A list column's elements by output name: one entry per struct field (``name_field``), else ``name``."""
    t = values.type
    if pa.types.is_struct(t):
        return {f"{name}_{t.field(i).name}": values.field(i) for i in range(t.num_fields)}
    return {name: values}


def _pad(out: dict[str, Any], name: str, col: pa.Array, pad_value: int | float) -> None:
    """A list or list-view column of numbers (or of structs of numbers) as ``[rows, longest]`` tensors
    padded with ``pad_value``, and ``name_lengths``: each row's elements copied from where its offset
    points in the values, so a list view is padded without gathering it into a list first."""
    starts, lengths = _extents(col)
    ends = np.cumsum(lengths)
    n, width = len(lengths), int(lengths.max()) if len(lengths) else 0
    for key, v in _element_fields(name, col.values).items():
        dtype = _plain_dtype(v.type)  # a dictionary's uint16 codes widen to int32 as they are copied
        pad = np.full(1, pad_value, dtype) if dtype is not None else None
        found = _raw(v, nulls=True)
        if found is not None and found[1] is not None:  # values with nulls, where they lie: null elements filled
            values, bitmap, bit = found
            padded = np.empty((n, width), dtype)
            null_fill = np.full(1, np.nan, dtype) if dtype.kind == "f" else pad
            _pad_rows_nullable()(values, bitmap, bit, starts, lengths, pad, null_fill, padded)
        else:
            flat, at = _batch_values(v, starts, lengths, ends, pad_value)
            dtype = dtype or flat.dtype
            padded = np.empty((n, width), dtype)
            _pad_rows()(flat, at, lengths, np.full(1, pad_value, dtype), padded)
        out[key] = torch.from_numpy(padded)
    out[f"{name}_lengths"] = torch.from_numpy(lengths)


@functools.cache
def _pad_rows() -> Callable[..., None]:
    """The compiled row copy of :func:`_pad` (numba, built on first use: NumPy has no "copy each row's
    run of values and pad the rest" kernel; its fancy-index and mask assignments measured 10x and 1.4x
    slower on 1,024 rows of 256-event histories, and a list view would first have to be gathered)."""
    import numba

    @numba.njit(cache=True, nogil=True)
    def pad_rows(values, starts, lengths, pad, out):  # pragma: no cover - compiled
        fill = pad[0]
        for i in range(out.shape[0]):
            s, m = starts[i], lengths[i]
            out[i, :m] = values[s : s + m]  # slice copies: 1.5x faster than an element loop (measured)
            out[i, m:] = fill

    return pad_rows


@functools.cache
def _pad_rows_nullable() -> Callable[..., None]:
    """:func:`_pad_rows` for values with a validity bitmap: a null element becomes ``null_fill``
    (NaN for floats, the pad for the rest), read where it lies instead of first taking the rows out."""
    import numba

    @numba.njit(cache=True, nogil=True)
    def pad_rows_nullable(values, bitmap, bit, starts, lengths, pad, null_fill, out):  # pragma: no cover - compiled
        fill, hole = pad[0], null_fill[0]
        for i in range(out.shape[0]):
            s, m = starts[i], lengths[i]
            row = out[i]
            row[:m] = values[s : s + m]
            row[m:] = fill
            # then the holes: whole bytes of valid bits skipped (2x faster than a test per element, measured)
            a, b = bit + s, bit + s + m
            k = a
            while k < b:
                if (k & 7) == 0 and k + 8 <= b and bitmap[k >> 3] == 255:
                    k += 8
                    continue
                if not (bitmap[k >> 3] >> (k & 7)) & 1:
                    row[k - a] = hole
                k += 1

    return pad_rows_nullable


def _numeric(t: pa.DataType) -> bool:
    """Whether a column of ``t`` becomes a tensor: numbers, booleans, times, and dictionary codes."""
    if pa.types.is_dictionary(t):
        return True
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t)


def _numpy(arr: pa.Array, pad_value: int | float) -> np.ndarray:
    """A writable numpy copy: floats keep NaN for nulls, the rest get ``pad_value``; times are int64."""
    return np.array(_values(arr, pad_value))


def _values(arr: pa.Array, pad_value: int | float) -> np.ndarray:
    """The values :func:`_numpy` copies, as numpy (a view of Arrow's memory where one is possible)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_dictionary(t):  # the codes: 32-bit, or 64 when the index type needs it
        arr = arr.indices.cast(pa.int64() if t.index_type.bit_width > 32 or t.index_type == pa.uint32() else pa.int32())
    elif pa.types.is_temporal(t):
        arr = arr.cast(pa.int64())
    elif pa.types.is_floating(t) and pa.types.is_float16(t):
        arr = arr.cast(pa.float32())
    if arr.null_count and not pa.types.is_floating(arr.type):
        arr = pc.fill_null(arr, pa.scalar(pad_value).cast(arr.type))
    return arr.to_numpy(zero_copy_only=False)
