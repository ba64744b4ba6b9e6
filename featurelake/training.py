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
  one, which ``drop_last`` drops. ``even_batches`` makes every worker of
  every rank yield the same number of full batches (``(rows // workers) //
  batch_size``, from metadata), so data-parallel ranks never wait on a rank
  that ran out: each worker drops the rest of its share, fewer than
  ``batch_size + 1`` rows, and ``dropped_rows`` says how many.
* **Speed.** Each open unit decodes in chunks of up to 65,536 rows (large
  reads decode cheaply; a unit that fits one chunk, typically one row group,
  is read in one call, faster than streaming it); a window is
  permuted with one gather (no per-batch ``take``, no per-row Python) of its
  decoded slices (a chunked table; Arrow's take concatenates it first) and
  batches are zero-copy slices of it (see ``featurelake.shuffle``). That
  gather is the cost a shuffle cannot avoid: unshuffled batches are slices of
  decoded files, shuffled ones must move every row once (``benchmarks/training.py``
  measures this floor). So the work is spread over the reader's threads,
  started once per reader (not per epoch): one collects ``prefetch`` windows
  (default 2) ahead of the consumer, in order; ``decode_threads`` workers
  (default 2) decode ahead (each open unit's next chunk, and the units the next
  windows open) and permute the windows collected: one prefers decoding, the
  other permuting, each kind in the order of the windows that need it
  (``featurelake.workpool``), so the two overlap and no more heavy threads run
  than a small machine has cores. ``prefetch=0`` collects and
  permutes in the consumer's thread; ``decode_threads=0`` decodes there too.
  Memory holds about ``2 * interleave`` decoded chunks and ``1 + prefetch``
  windows. Closing the iterator (or dropping it) stops the work of the epoch;
  ``close()`` stops the threads.

The pieces live in ``featurelake.shuffle`` (units, shards, windows, quality)
and ``featurelake.sampling``; this module is the reader and its position.

Filters, sampling and the sequence joins apply after the order is fixed, so
with them shards are balanced in source rows, not in rows emitted.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
from pyiceberg.expressions import BooleanExpression

from featurelake import placement, refs
from featurelake.errors import FeatureLakeError, SchemaMismatchError
from featurelake.readstats import EpochClock, ReadStats
from featurelake.sampling import path_hash, row_uniforms
from featurelake.shuffle import PERMUTE, Piece, Unit, WindowReader, prepare_permutations, shard, shuffle_quality, windows
from featurelake.workpool import PriorityPool

__all__ = [
    "TrainingReader", "ReadStats", "Unit", "Piece", "shard", "windows", "shuffle_quality", "path_hash", "row_uniforms",
]

if TYPE_CHECKING:
    from featurelake.table import Table

DEFAULT_TRAINING_BATCH = 1024
DEFAULT_SHUFFLE_BUFFER = 65_536
DEFAULT_INTERLEAVE = 8
DECODE_THREADS = 2  # workers decoding ahead and permuting windows (0: all in the collecting thread)
_STATE_VERSION = 2  # 2: windows permuted by Fisher-Yates over SplitMix64 (1 used Generator.permutation)


# -------------------------------------------------------------------- reader
class TrainingReader:
    """Sharded, shuffled, sampled, resumable fixed-size batches over one snapshot.

    Iterate it for ``pyarrow.RecordBatch`` es. ``set_worker`` selects this
    process's data-loader worker (``featurelake.torch`` does it from
    ``get_worker_info``); ``set_epoch`` starts another shuffle; ``state_dict``
    and ``load_state_dict`` save and restore the position between batches.
    ``prefetch`` (windows collected ahead, default 2) and ``decode_threads``
    (workers decoding ahead and permuting, default 2) change speed and memory,
    never the rows or their order; the threads live as long as the reader
    (``close`` stops them; a copied or forked reader starts its own).
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
        even_batches: bool = False,
        prefetch: int = 2,
        decode_threads: int = DECODE_THREADS,
    ) -> None:
        _check_int("batch_size", batch_size, 1)
        _check_int("shuffle_buffer", shuffle_buffer, 1)
        _check_int("interleave", interleave, 1)
        _check_int("world_size", world_size, 1)
        _check_int("epoch", epoch, 0)
        _check_int("seed", seed, 0)
        _check_int("prefetch", prefetch, 0)
        _check_int("decode_threads", decode_threads, 0)
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
        if even_batches and (filter is not None or sample is not None or rates):
            raise FeatureLakeError(
                "even_batches counts batches from metadata row counts, so it cannot be combined with "
                "filter, sample or label_rates (their row counts are known only after reading)"
            )
        self.table = table
        self.even_batches = bool(even_batches)
        self.prefetch = prefetch
        self.decode_threads = decode_threads
        self._pools_: dict[str, ThreadPoolExecutor] = {}
        self._pool_pid = os.getpid()
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
        self.local = self.scan._local  # local disk, or an object store (decode-ahead depth: featurelake.shuffle)
        placement.record(self.scan.ice, self.scan.read_schema.column_names if wanted is not None else None)
        self._hashes = [path_hash(t.file.file_path) for t in self.tasks]
        self.units = _plan_units(self.scan, self.tasks)
        if self.shuffle:  # loaded here, before DataLoader forks its workers: each would pay ~0.5 s per epoch
            prepare_permutations()
        self.num_rows = sum(u.rows for u in self.units)
        self._position = (0, 0)  # (window, rank in window): the next row to emit
        self._finished = False
        self.batches_emitted = 0
        self._reset_stats()

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
            self._reset_stats()

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

    def batches_per_epoch(self) -> int | None:
        """With ``even_batches``: the batches every worker of every rank yields per epoch (else None)."""
        if not self.even_batches:
            return None
        _, workers = self.global_worker
        return (self.num_rows // workers) // self.batch_size

    def dropped_rows(self) -> int:
        """The rows of this worker's share that ``even_batches`` leaves out this epoch (0 without it)."""
        n = self.batches_per_epoch()
        return 0 if n is None else self.shard_rows() - n * self.batch_size

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
            "even_batches": self.even_batches,
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
            raise FeatureLakeError(
                f"not a TrainingReader state of this featurelake (version {_STATE_VERSION}; a state of another version "
                f"orders rows differently and cannot resume exactly): {state!r}"
            )
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
        self._reset_stats()

    # -------------------------------------------------------------- reading
    def __iter__(self) -> Iterator[pa.RecordBatch]:
        """This worker's batches for the current epoch, from the saved position on.

        Iterating again after an epoch ended starts the next epoch.
        """
        if self._finished:
            self.set_epoch(self.epoch + 1)
        stream = self._batches()
        if self.sequences or self.features:
            stream = self._joined(stream)
        return self._clock.timed(stream)

    def stats(self) -> ReadStats:
        """This epoch's reading as this process saw it: what was handed out, and how long the consumer waited.

        ``waited_s`` is the time spent inside the iterator, asking for batches
        (decoding, shuffling and joining that the threads ahead had not
        finished): next to ``elapsed_s``, it says whether training is bound
        by its input. A data-loader worker's reader keeps its own.
        """
        return self._clock.stats(self.epoch, self.batches_emitted)

    def _reset_stats(self) -> None:
        self._clock = EpochClock()

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
        epoch, size = self.epoch, self.batch_size
        units = self.shard_units(epoch)
        plan = list(windows(units, self.interleave, self.shuffle_buffer))
        start_window, start_offset = self._position
        limit = self.batches_per_epoch()
        g, _ = self.global_worker
        rest: list[pa.RecordBatch] = []  # rows waiting for the next batch (from earlier windows)
        rest_rows, rest_end = 0, (0, 0)
        pool, work = self._pools()
        reader = WindowReader(self, units, epoch, g, work, plan=plan)
        futures: dict[int, Future] = {}

        def prepared(v: int) -> Future:  # on the prefetch thread: windows are collected in order
            job = reader.prepare(plan[v], v)
            if work is None or reader.closed:
                return _done(job.finish())
            return reader.submit(job.finish, v, PERMUTE)

        def window(w: int) -> tuple[pa.RecordBatch | None, np.ndarray | None]:
            if pool is None:
                return reader.read(plan[w], w)
            for v in range(w, min(len(plan), w + 1 + self.prefetch)):
                if v not in futures:
                    futures[v] = pool.submit(prepared, v)
            return futures.pop(w).result().result()

        try:
            for w in range(start_window, len(plan)):
                if limit is not None and self.batches_emitted >= limit:
                    break
                rows, ranks = window(w)
                base = 0  # with ranks None (nothing dropped), row k of rows has rank base + k
                if rows is not None and w == start_window and start_offset:
                    if ranks is None:
                        base = cut = min(start_offset, rows.num_rows)
                    else:
                        cut = int(np.searchsorted(ranks, start_offset))  # ranks increase: keep the rest
                        ranks = ranks[cut:]
                    rows = rows.slice(cut)
                if rows is None or not rows.num_rows:
                    continue
                i, n = 0, rows.num_rows
                last = base + n - 1 if ranks is None else int(ranks[-1])
                if rest_rows:
                    need = size - rest_rows
                    if n < need:
                        rest.append(rows)
                        rest_rows, rest_end = rest_rows + n, (w, last)
                        continue
                    rank = base + need - 1 if ranks is None else ranks[need - 1]
                    yield self._emit(pa.concat_batches(rest + [rows.slice(0, need)]), w, rank)
                    rest, rest_rows, i = [], 0, need
                while n - i >= size and (limit is None or self.batches_emitted < limit):
                    rank = base + i + size - 1 if ranks is None else ranks[i + size - 1]
                    yield self._emit(rows.slice(i, size), w, rank)
                    i += size
                if i < n:
                    rest, rest_rows, rest_end = [rows.slice(i)], n - i, (w, last)
            if rest_rows and not self.drop_last and limit is None:
                yield self._emit(pa.concat_batches(rest) if len(rest) > 1 else rest[0], *rest_end)
            self._finished = True
            self._position = (len(plan), 0)
        finally:
            # Stop reading ahead: windows not started are dropped, the one in flight is waited for (it may
            # still be submitting decodes), so are permutations running; then queued decodes are dropped
            # and running ones waited for. Nothing of this epoch runs after the iterator is closed.
            reader.closed = True
            for f in futures.values():
                f.cancel()
            gathers = []
            for f in futures.values():
                if not f.cancelled():
                    wait([f])
                    if f.exception() is None and not f.result().cancel():
                        gathers.append(f.result())
            wait(gathers)  # permutations already running (dropped, but done before this returns)
            reader.close()

    def _pools(self) -> tuple[ThreadPoolExecutor | None, PriorityPool | None]:
        """The reader's threads, started once and kept for its lifetime: the window-prefetch thread (collects
        windows in order) and ``decode_threads`` workers that decode ahead and permute the windows collected
        (one prefers each kind; see ``featurelake.workpool``).

        Starting threads per epoch costs a scheduling wait each on a busy
        machine. A forked copy (a data-loader worker) starts its own: the
        parent's threads do not exist there.
        """
        if self._pool_pid != os.getpid():
            self._pools_ = {}
            self._pool_pid = os.getpid()
        if self.prefetch and "train" not in self._pools_:
            self._pools_["train"] = ThreadPoolExecutor(1, thread_name_prefix="featurelake-train")
        if self.decode_threads and "work" not in self._pools_:
            self._pools_["work"] = PriorityPool(self.decode_threads, name="featurelake-work")
        return self._pools_.get("train") if self.prefetch else None, self._pools_.get("work") if self.decode_threads else None

    def close(self) -> None:
        """Stop the reader's threads (they also stop when the reader is garbage-collected)."""
        if self._pool_pid == os.getpid():
            for pool in self._pools_.values():
                pool.shutdown(wait=True, cancel_futures=True)
        self._pools_ = {}

    def __getstate__(self) -> dict[str, Any]:
        """What a spawned data-loader worker gets: the planned reading half, no catalog and no threads.

        (Forked workers copy the reader instead.) The scan is shipped with the
        update layers of its files and the views with their build records
        (``featurelake.shipping``), so the worker reads the same snapshot
        without opening the catalog; threads start in the worker.
        """
        from featurelake.shipping import ShippedScan, ShippedView

        state = dict(self.__dict__)
        state["_pools_"] = {}
        state["table"] = None
        state["scan"] = ShippedScan(self.scan, [t.file.file_path for t in self.tasks])
        state["sequences"] = {name: ShippedView(v) for name, v in self.sequences.items()}
        state["features"] = {name: ShippedView(v) for name, v in self.features.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        state["scan"] = state["scan"].open()
        state["sequences"] = {name: v.open() for name, v in state["sequences"].items()}
        state["features"] = {name: v.open() for name, v in state["features"].items()}
        state["_pool_pid"] = None  # threads start on first use in this process
        self.__dict__.update(state)
        self._reset_stats()

    def _emit(self, batch: pa.RecordBatch, window: int, rank: int) -> pa.RecordBatch:
        """Hand out ``batch``, whose last row is rank ``rank`` of window ``window``."""
        self._position = (window, int(rank) + 1)
        self.batches_emitted += 1
        return batch


def _done(value: Any) -> Future:
    """A future that already holds ``value``."""
    f: Future = Future()
    f.set_result(value)
    return f


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
