"""Training reads: sharded, shuffled, sampled and resumable batches over one snapshot.

Why: a data-parallel training job runs ``world_size`` processes, each with
several data-loader workers. Every worker must see the same data (one
snapshot, fixed at construction), read a disjoint, balanced share of it, in an
order that mixes files, and resume after a restart without repeating or
skipping a row. ``Table.batches`` does none of that; this module does, with no
framework dependency (``featurelake.torch`` wraps it for PyTorch).

How:

* **Units.** The snapshot's data files are planned once and cut into units,
  one per Parquet row group (row counts from the data file's metadata, or its
  footer when it has several row groups). No data is read to plan.
* **Sharding.** Each epoch the units are permuted with ``(seed, epoch)``;
  their rows, laid end to end, are cut into ``world_size * num_workers``
  contiguous ranges of equal length (to one row), so each global worker gets
  a share of the rows that differs from any other's by at most one row, made
  of whole units plus at most two partial ones. Each row is read exactly once
  per epoch across all workers.
* **Shuffle.** A worker reads ``interleave`` of its units at once and cuts
  each into slices of ``shuffle_buffer / interleave`` rows; one slice of each
  open unit forms a *window* of up to ``shuffle_buffer`` rows whose rows are
  emitted in a random order drawn from ``(seed, epoch, worker, window)``. The
  order is a function of metadata only, so the reader's position is just
  ``(epoch, window, rank in window)``: that is what ``state_dict`` stores,
  and a resumed reader re-reads one window and emits exactly the rest.
* **Sampling.** Whether a row is kept is decided by a hash of ``(seed,
  data file, row position)``, so it does not depend on the sharding, the
  epoch or the batch size. ``label_rates`` keeps each label value at its own
  rate; ``weight_column`` then carries ``1 / label rate`` so the loss stays
  unbiased (standard negative downsampling). A uniform ``sample`` keeps the
  label mix, so it does not change the weights.
* **Batches** have exactly ``batch_size`` rows, except each worker's last
  one, which ``drop_last`` drops.

Filters, sampling and the sequence joins apply after the order is fixed, so
with them shards are balanced in source rows, not in rows emitted.
"""
from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import BooleanExpression

from featurelake import refs
from featurelake import placement
from featurelake.errors import FeatureLakeError, SchemaMismatchError
from featurelake.schema import LOCATOR_FILE

if TYPE_CHECKING:
    from featurelake.table import Table

DEFAULT_TRAINING_BATCH = 1024
DEFAULT_SHUFFLE_BUFFER = 65_536
DEFAULT_INTERLEAVE = 8
_STATE_VERSION = 1


@dataclass(frozen=True)
class Unit:
    """Rows [start, stop) of one data file (``task`` indexes the reader's planned files)."""

    task: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of the ``slot``-th unit of a worker's share, read into one window."""

    slot: int
    start: int
    stop: int


# ------------------------------------------------------------------ planning
def shard(units: Sequence[Unit], workers: int, worker: int) -> list[Unit]:
    """The rows of ``units`` (laid end to end) that global worker ``worker`` of ``workers`` reads.

    Cut points are ``g * total // workers``: shares differ by at most one row.
    """
    total = sum(u.rows for u in units)
    lo, hi = worker * total // workers, (worker + 1) * total // workers
    out, offset = [], 0
    for u in units:
        a, b = max(lo, offset), min(hi, offset + u.rows)
        if b > a:
            out.append(Unit(u.task, u.start + (a - offset), u.start + (b - offset)))
        offset += u.rows
        if offset >= hi:
            break
    return out


def windows(units: Sequence[Unit], interleave: int, buffer: int) -> Iterator[list[Piece]]:
    """The windows a worker reads its units in: ``interleave`` units open, a slice of each per window."""
    per = max(1, -(-buffer // interleave))
    active: list[list[int]] = []  # [slot, next row]
    queue = 0
    while True:
        while len(active) < interleave and queue < len(units):
            active.append([queue, units[queue].start])
            queue += 1
        if not active:
            return
        window = []
        for slot in active:
            unit = units[slot[0]]
            stop = min(unit.stop, slot[1] + per)
            window.append(Piece(slot[0], slot[1], stop))
            slot[1] = stop
        active = [s for s in active if s[1] < units[s[0]].stop]
        yield window


# ----------------------------------------------------------------- sampling
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a stateless, well-mixed 64-bit hash of each element."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def path_hash(path: str) -> int:
    """A 64-bit hash of a file path that is the same in every process (``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(path.encode(), digest_size=8).digest(), "little")


def row_uniforms(seed: int, file_hash: int, positions: np.ndarray) -> np.ndarray:
    """A uniform [0, 1) number per row, fixed by (seed, file, row position)."""
    with np.errstate(over="ignore"):
        base = _mix(np.array([file_hash ^ (seed * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF)], dtype=np.uint64))
        x = _mix(positions.astype(np.uint64) * _GOLDEN + base)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


# ------------------------------------------------------------------- quality
def shuffle_quality(batches: Iterable[pa.RecordBatch], key: str, source: str = LOCATOR_FILE, seed: int = 0) -> dict[str, Any]:
    """How well ``batches`` are shuffled, next to a full random permutation of the same rows.

    Two measures, for the batches as given (``reader``) and for the same rows
    fully permuted and cut at the same batch sizes (``random``):

    * ``distinct_sources_per_batch``: mean number of distinct ``source`` values
      (data files) per batch; higher is better mixed.
    * ``position_key_correlation``: Spearman correlation between a row's
      position in the stream and its ``key``; 0 is ideal, 1 is file order.
    """
    keys, sources, sizes = [], [], []
    for b in batches:
        keys.append(b.column(key))
        if source in b.schema.names:
            sources.append(b.column(source))
        sizes.append(b.num_rows)
    if not sizes or not sum(sizes):
        raise FeatureLakeError("shuffle_quality needs at least one row")
    k = pa.chunked_array(keys).to_numpy()
    s = pc.dictionary_encode(pa.chunked_array(sources)).combine_chunks().indices.to_numpy() if sources else None
    perm = np.random.default_rng(seed).permutation(len(k))
    return {
        "rows": int(len(k)),
        "batches": len(sizes),
        "reader": _quality(k, s, sizes),
        "random": _quality(k[perm], s[perm] if s is not None else None, sizes),
    }


def _quality(keys: np.ndarray, sources: np.ndarray | None, sizes: list[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    if len(keys) > 1:
        key_rank = np.argsort(np.argsort(keys, kind="stable"), kind="stable").astype(np.float64)
        c = np.corrcoef(np.arange(len(keys), dtype=np.float64), key_rank)[0, 1]
        out["position_key_correlation"] = round(float(c), 4)
    if sources is not None:
        bounds = np.cumsum([0] + sizes)
        distinct = [len(np.unique(sources[a:b])) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        out["distinct_sources_per_batch"] = round(float(np.mean(distinct)), 3)
    return out


# -------------------------------------------------------------------- reader
class TrainingReader:
    """Sharded, shuffled, sampled, resumable fixed-size batches over one snapshot.

    Iterate it for ``pyarrow.RecordBatch`` es. ``set_worker`` selects this
    process's data-loader worker (``featurelake.torch`` does it from
    ``get_worker_info``); ``set_epoch`` starts another shuffle; ``state_dict``
    and ``load_state_dict`` save and restore the position between batches.
    """

    def __init__(
        self,
        table: "Table",
        columns: Sequence[str] | None = None,
        filter: str | BooleanExpression | None = None,
        branch: str = refs.MAIN,
        snapshot_id: int | None = None,
        batch_size: int = DEFAULT_TRAINING_BATCH,
        shuffle: bool = True,
        seed: int = 0,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        sample: float | None = None,
        label_rates: Mapping[Any, float] | None = None,
        weight_column: str | None = None,
        sequences: dict[str, Any] | None = None,
        label_column: str | None = None,
        features: dict[str, Any] | None = None,
        drop_last: bool = False,
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
        interleave: int = DEFAULT_INTERLEAVE,
        with_locator: bool = False,
        worker_id: int = 0,
        num_workers: int = 1,
    ) -> None:
        _check_int("batch_size", batch_size, 1)
        _check_int("shuffle_buffer", shuffle_buffer, 1)
        _check_int("interleave", interleave, 1)
        _check_int("world_size", world_size, 1)
        _check_int("epoch", epoch, 0)
        _check_int("seed", seed, 0)
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise FeatureLakeError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
        if sample is not None and not (isinstance(sample, (int, float)) and 0.0 < sample <= 1.0):
            raise FeatureLakeError(f"sample must be a fraction in (0, 1], got {sample!r}")
        rates = dict(label_rates or {})
        bad = {k: v for k, v in rates.items() if not (isinstance(v, (int, float)) and 0.0 < v <= 1.0)}
        if bad:
            raise FeatureLakeError(f"label_rates must be fractions in (0, 1], got {bad}")
        if rates and not label_column:
            raise FeatureLakeError("label_rates needs label_column: the column whose values the rates are keyed by")
        self.table = table
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.epoch = epoch
        self.rank = rank
        self.world_size = world_size
        self.sample = float(sample) if sample is not None else None
        self.label_rates = rates
        self.label_column = label_column
        self.weight_column = weight_column
        self.drop_last = drop_last
        self.shuffle_buffer = shuffle_buffer
        self.interleave = interleave if self.shuffle else 1
        self.sequences = dict(sequences or {})
        self.features = dict(features or {})
        self.worker_id, self.num_workers = 0, 1
        self.set_worker(worker_id, num_workers)

        # The columns to read: the projection, plus what sampling and the joins need (dropped after).
        wanted = list(columns) if columns is not None else None
        join_extra: list[str] = []
        if self.sequences or self.features:
            from featurelake.sequences.featurejoin import plan_joins

            wanted, join_extra = plan_joins(wanted, self.sequences, self.features)
        label_extra = [label_column] if rates and wanted is not None and label_column not in wanted else []
        self.scan = table.scan(
            None if wanted is None else wanted + label_extra, filter, branch, snapshot_id, with_locator=with_locator
        )
        self.snapshot_id = self.scan.snapshot.snapshot_id if self.scan.snapshot is not None else None
        names = self.scan.output_schema.names
        if rates and label_column not in names:
            raise SchemaMismatchError(f"label_column {label_column!r} is not a column of the table", [label_column])
        joined = [f.name for name, v in self.features.items() for f in v.output_fields(name)] if self.features else []
        if weight_column is not None and (weight_column in names or weight_column in self.sequences or weight_column in joined):
            raise SchemaMismatchError(f"weight_column {weight_column!r} clashes with a column of the read", [weight_column])
        if self.features:
            from featurelake.sequences.featurejoin import check_joins

            check_joins(self.scan.output_schema, self.sequences, self.features)
        self._label_extra = label_extra
        self._join_extra = join_extra
        self.tasks = sorted(self.scan.tasks(), key=lambda t: t.file.file_path)
        placement.record(self.scan.ice, self.scan.read_schema.column_names if wanted is not None else None)
        self._hashes = [path_hash(t.file.file_path) for t in self.tasks]
        self.units = _plan_units(self.scan, self.tasks)
        self.num_rows = sum(u.rows for u in self.units)
        self._position = (0, 0)  # (window, rank in window): the next row to emit
        self._finished = False
        self.batches_emitted = 0

    # ----------------------------------------------------------- placement
    def set_worker(self, worker_id: int, num_workers: int) -> None:
        """Read as data-loader worker ``worker_id`` of ``num_workers`` inside this rank."""
        _check_int("num_workers", num_workers, 1)
        if not isinstance(worker_id, int) or not 0 <= worker_id < num_workers:
            raise FeatureLakeError(f"worker_id must be in [0, num_workers={num_workers}), got {worker_id!r}")
        self.worker_id, self.num_workers = worker_id, num_workers

    def set_rank(self, rank: int, world_size: int) -> None:
        """Read as process ``rank`` of ``world_size`` (data-parallel ranks)."""
        _check_int("world_size", world_size, 1)
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise FeatureLakeError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
        self.rank, self.world_size = rank, world_size

    @property
    def global_worker(self) -> tuple[int, int]:
        """(this worker's index, the number of workers) over all ranks."""
        return self.rank * self.num_workers + self.worker_id, self.world_size * self.num_workers

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a new shuffle); the current epoch, unfinished, keeps its position."""
        _check_int("epoch", epoch, 0)
        if epoch != self.epoch or self._finished:
            self.epoch = epoch
            self._position = (0, 0)
            self._finished = False
            self.batches_emitted = 0

    def shard_units(self, epoch: int | None = None) -> list[Unit]:
        """This worker's row ranges for ``epoch``, in reading order (metadata only)."""
        epoch = self.epoch if epoch is None else epoch
        units = self.units
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(units))
            units = [units[i] for i in order]
        g, n = self.global_worker
        return shard(units, n, g)

    def shard_rows(self) -> int:
        """The source rows this worker reads per epoch (before filters and sampling)."""
        return sum(u.rows for u in self.shard_units())

    # ---------------------------------------------------------------- state
    def _layout(self) -> dict[str, Any]:
        return {
            "snapshot_id": self.snapshot_id,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "worker_id": self.worker_id,
            "num_workers": self.num_workers,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer,
            "interleave": self.interleave,
        }

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed out: plain ints, JSON- and torch-saveable."""
        window, offset = self._position
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "window": window,
            "offset": offset,
            "finished": self._finished,
            "batches": self.batches_emitted,
            **self._layout(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next batch starts at the first row not yet handed out."""
        if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
            raise FeatureLakeError(f"not a TrainingReader state (version {_STATE_VERSION}): {state!r}")
        mine = self._layout()
        differ = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if differ:
            raise FeatureLakeError(
                "the state was saved by a reader with another layout (saved, now): "
                + ", ".join(f"{k}={a!r}, {b!r}" for k, (a, b) in differ.items())
            )
        self.epoch = int(state["epoch"])
        self._position = (int(state["window"]), int(state["offset"]))
        self._finished = bool(state["finished"])
        self.batches_emitted = int(state["batches"])

    # -------------------------------------------------------------- reading
    def __iter__(self) -> Iterator[pa.RecordBatch]:
        """This worker's batches for the current epoch, from the saved position on.

        Iterating again after an epoch ended starts the next epoch.
        """
        if self._finished:
            self.set_epoch(self.epoch + 1)
        stream = self._batches()
        if not (self.sequences or self.features):
            return stream
        return self._joined(stream)

    def _joined(self, stream: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from featurelake.sequences.featurejoin import apply_joins_batches

        # The join reads one batch ahead: hand out the position that belongs to each joined batch.
        positions: list[tuple[tuple[int, int], bool, int]] = []
        done: list[tuple[tuple[int, int], bool, int]] = []

        def source() -> Iterator[pa.RecordBatch]:
            for batch in stream:
                positions.append((self._position, self._finished, self.batches_emitted))
                yield batch
            done.append((self._position, self._finished, self.batches_emitted))

        for batch in apply_joins_batches(source(), self.sequences, self.features, drop=self._join_extra):
            self._position, self._finished, self.batches_emitted = positions.pop(0)
            yield batch
        if done:
            self._position, self._finished, self.batches_emitted = done[0]

    def _batches(self) -> Iterator[pa.RecordBatch]:
        epoch = self.epoch
        units = self.shard_units(epoch)
        plan = list(windows(units, self.interleave, self.shuffle_buffer))
        start_window, start_offset = self._position
        pending: list[pa.Table] = []  # rows ready to batch, with their (window, rank) in the columns below
        pending_rows = 0
        g, _ = self.global_worker
        reader = _WindowReader(self, units)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="featurelake-train") as pool:
            futures = {}

            def ahead(w: int) -> None:
                if w < len(plan) and w not in futures:
                    futures[w] = pool.submit(reader.read, plan[w], w, epoch, g)

            try:
                for w in range(start_window, len(plan)):
                    ahead(w)
                    ahead(w + 1)
                    rows, ranks = futures.pop(w).result()
                    if w == start_window and start_offset:
                        keep = ranks >= start_offset
                        rows, ranks = rows.filter(pa.array(keep)), ranks[keep]
                    if not rows.num_rows:
                        continue
                    rows = rows.append_column("__window", pa.array(np.full(rows.num_rows, w, np.int64)))
                    rows = rows.append_column("__rank", pa.array(ranks.astype(np.int64)))
                    pending.append(rows)
                    pending_rows += rows.num_rows
                    while pending_rows >= self.batch_size:
                        batch, pending, pending_rows = _cut(pending, self.batch_size)
                        yield self._emit(batch)
                if pending_rows and not self.drop_last:
                    batch, pending, pending_rows = _cut(pending, pending_rows)
                    yield self._emit(batch)
                self._finished = True
                self._position = (len(plan), 0)
            finally:
                for f in futures.values():
                    f.cancel()

    def _emit(self, batch: pa.Table) -> pa.RecordBatch:
        w = batch.column("__window")[-1].as_py()
        r = batch.column("__rank")[-1].as_py()
        self._position = (w, r + 1)
        self.batches_emitted += 1
        batch = batch.drop_columns(["__window", "__rank"] + self._label_extra)
        return batch.combine_chunks().to_batches()[0]


class _WindowReader:
    """Reads the windows of one worker's share: keeps each open unit's stream between windows."""

    def __init__(self, reader: TrainingReader, units: list[Unit]) -> None:
        self.r = reader
        self.units = units
        self.streams: dict[int, Iterator[tuple[pa.RecordBatch, np.ndarray, int]]] = {}
        self.carry: dict[int, tuple[pa.RecordBatch, np.ndarray, int]] = {}
        self.layers: dict[int, list] = {}

    def _stream(self, slot: int, start: int) -> Iterator[tuple[pa.RecordBatch, np.ndarray, int]]:
        if slot not in self.streams:
            unit = self.units[slot]
            task = self.r.tasks[unit.task]
            if unit.task not in self.layers:
                self.layers = {unit.task: self.r.scan.layers_for(task.file.file_path), **self.layers}
            per = max(1, -(-self.r.shuffle_buffer // self.r.interleave))
            self.streams[slot] = self.r.scan.read_range(
                task, start, unit.stop, layers=self.layers[unit.task], batch_size=max(per, 65_536)
            )
        return self.streams[slot]

    def _piece(self, piece: Piece) -> tuple[list[pa.RecordBatch], list[np.ndarray]]:
        """The surviving rows of one piece and their file positions."""
        batches, positions = [], []
        chunk = self.carry.pop(piece.slot, None)
        stream = self._stream(piece.slot, piece.start)
        end = piece.start
        while True:
            if chunk is None:
                if end >= piece.stop:
                    break
                chunk = next(stream, None)
                if chunk is None:
                    break
            batch, pos, end = chunk
            chunk = None
            if end > piece.stop:  # the chunk runs into the next piece: keep the rest for it
                cut = int(np.searchsorted(pos, piece.stop))
                self.carry[piece.slot] = (batch.slice(cut), pos[cut:], end)
                batch, pos = batch.slice(0, cut), pos[:cut]
                end = piece.stop
            batches.append(batch)
            positions.append(pos)
        if piece.stop >= self.units[piece.slot].stop:
            self.streams.pop(piece.slot, None)
            self.carry.pop(piece.slot, None)
        return batches, positions

    def read(self, window: list[Piece], w: int, epoch: int, worker: int) -> tuple[pa.Table, np.ndarray]:
        """One window's kept rows in emission order, and each one's rank in the window's order."""
        r = self.r
        parts, local, uniforms = [], [], []
        offset = 0
        for piece in window:
            batches, positions = self._piece(piece)
            unit = self.units[piece.slot]
            for b, pos in zip(batches, positions):
                if b.num_rows:
                    parts.append(b)
                    local.append(offset + (pos - piece.start))
                    if r.sample is not None or r.label_rates:
                        uniforms.append(row_uniforms(r.seed, r._hashes[unit.task], pos))
            offset += piece.stop - piece.start
        if not parts:
            return pa.table({}), np.empty(0, np.int64)
        rows = pa.Table.from_batches(parts, schema=parts[0].schema)
        idx = np.concatenate(local)
        keep = None
        if uniforms:
            rate = np.full(rows.num_rows, r.sample if r.sample is not None else 1.0)
            label_rate = np.ones(rows.num_rows)
            if r.label_rates:
                labels = rows.column(r.label_column)
                for value, value_rate in r.label_rates.items():
                    hit = pc.fill_null(pc.equal(labels, pa.scalar(value, labels.type)), False).to_numpy(zero_copy_only=False)
                    label_rate[hit] = value_rate
            keep = np.concatenate(uniforms) < rate * label_rate
            if r.weight_column is not None:
                rows = rows.append_column(pa.field(r.weight_column, pa.float32(), nullable=False), pa.array((1.0 / label_rate).astype(np.float32)))
        elif r.weight_column is not None:
            rows = rows.append_column(pa.field(r.weight_column, pa.float32(), nullable=False), pa.array(np.ones(rows.num_rows, np.float32)))
        survivors = np.arange(rows.num_rows) if keep is None else np.flatnonzero(keep)
        if r.shuffle:  # emit in the window's random order: walk the permutation, keeping survivors
            perm = np.random.default_rng([r.seed, epoch, worker, w]).permutation(offset)
            row_of = np.full(offset, -1, np.int64)
            row_of[idx[survivors]] = survivors
            picked = row_of[perm]
            found = picked >= 0
            order, ranks = picked[found], np.flatnonzero(found)
        else:
            order, ranks = survivors, idx[survivors].astype(np.int64)
        if keep is not None or r.shuffle:
            rows = rows.take(pa.array(order))
        return rows, ranks


def _cut(pending: list[pa.Table], n: int) -> tuple[pa.Table, list[pa.Table], int]:
    """The first ``n`` rows of ``pending`` and what remains."""
    taken, rest, need = [], [], n
    for t in pending:
        if need >= t.num_rows:
            taken.append(t)
            need -= t.num_rows
        elif need > 0:
            taken.append(t.slice(0, need))
            rest.append(t.slice(need))
            need = 0
        else:
            rest.append(t)
    batch = pa.concat_tables(taken) if len(taken) > 1 else taken[0]
    return batch, rest, sum(t.num_rows for t in rest)


def _plan_units(scan: Any, tasks: list) -> list[Unit]:
    """One unit per row group of each planned data file, from metadata (footers only when needed)."""
    units: list[Unit] = []
    need_footer = [i for i, t in enumerate(tasks) if len(t.file.split_offsets or ()) != 1]
    counts: dict[int, list[int]] = {}
    if need_footer:
        def groups(i: int) -> list[int]:
            md = scan._open(tasks[i].file.file_path).metadata
            return [md.row_group(g).num_rows for g in range(md.num_row_groups)]

        with ThreadPoolExecutor(max_workers=8) as pool:
            counts = dict(zip(need_footer, pool.map(groups, need_footer)))
    for i, t in enumerate(tasks):
        start = 0
        for n in counts.get(i, [t.file.record_count]):
            if n:
                units.append(Unit(i, start, start + n))
            start += n
    return units


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise FeatureLakeError(f"{name} must be an integer >= {minimum}, got {value!r}")
