"""Dense column writes: a value for every row of a snapshot, written without any key lookup.

When a new feature is computed for every row, the update file of each data
file is simply the column in that file's row order (a dense update file: no
positions). Two ways to say which value belongs to which row:

* **Scan order.** The values come in the table's own scan order at a
  snapshot: data files in the order Iceberg plans the snapshot without a
  filter (:class:`ScanOrder` ``.files``), each file's rows in position order.
  That is exactly the row order of ``t.read(columns=[key], snapshot_id=s)``
  (and of the ``_file``/``_pos`` columns of ``read(with_locator=True)``), so
  "read the key, compute, write back" needs no lookup at all: each file's
  update file is a slice of the input. The write is refused
  (SnapshotMovedError) if the branch has moved past ``s``: another snapshot
  may hold other files or rows in another order.
* **By key.** The values come with their keys in any order, covering every
  row exactly once. The input is sorted by key once and each data file's key
  column is merged against it (a binary search of sorted keys, no hash
  table); the result is again a dense update file per data file.

Update files of one commit are written in parallel (small dense layers share
one, a row group each: featurelake.updatefiles), and the commit is one Iceberg
snapshot like any backfill (featurelake.updates).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from featurelake import refs
from featurelake.commit import cleanup_on_failure, delete_quietly, optimistic
from featurelake.errors import InvalidArgumentError, SchemaMismatchError, SnapshotMovedError, UnknownKeyError
from featurelake.index import encode, key_is_exact, read_key_columns
from featurelake.keys import check_keys, conform_keys
from featurelake.lru import LRU
from featurelake.threads import run_all
from featurelake.schema import RESERVED_PREFIX, arrow_schema, check_column_names, to_table
from featurelake.updates import WRITE_THREADS, UpdateReport, _check_types, commit_update_files, fit_values

if TYPE_CHECKING:
    from featurelake.table import Table

DIRECT_SPAN = 4  # integer keys spanning at most this many slots per key are matched by direct addressing


@dataclass(frozen=True)
class ScanOrder:
    """The row order of a snapshot: ``files`` in planning order, ``rows[i]`` rows of ``files[i]`` in position order."""

    snapshot_id: int | None
    files: tuple[str, ...]
    rows: tuple[int, ...]

    @property
    def total_rows(self) -> int:
        return sum(self.rows)

    def slices(self) -> list[tuple[str, int, int]]:
        """(data file, first row in scan order, rows) of every file."""
        starts = np.concatenate([[0], np.cumsum(self.rows, dtype=np.int64)])
        return [(f, int(a), n) for f, a, n in zip(self.files, starts[:-1], self.rows)]


def scan_order(table: "Table", ice: IcebergTable, snapshot: Snapshot | None) -> ScanOrder:
    """The scan order of ``snapshot`` (the plan ``Table.read`` uses, without a filter).

    A snapshot's files never change, so its order is planned once per process
    (``t.scan_order()`` then ``t.add_column(...)`` plan the snapshot once).
    """
    if snapshot is None:
        return ScanOrder(None, (), ())
    key = f"{ice.metadata.table_uuid}/{snapshot.snapshot_id}"
    found = _ORDERS.get(key)
    if found is None:
        tasks = table.scan([], snapshot_id=snapshot.snapshot_id, ice=ice).tasks()
        found = ScanOrder(snapshot.snapshot_id, tuple(t.file.file_path for t in tasks), tuple(t.file.record_count for t in tasks))
        _ORDERS.put(key, found)
    return found


_ORDERS = LRU(256)


def write_dense(
    table: "Table", values: Any, snapshot_id: int, branch: str, keys: Any = None
) -> UpdateReport:
    """Set ``values``' columns for every row of ``snapshot_id`` (the head of ``branch``) in one commit.

    Without ``keys`` the rows of ``values`` are in the snapshot's scan order;
    with ``keys`` (the key column(s), one row per row of ``values``) they may
    come in any order but must hold every key of the snapshot exactly once.
    """
    values = to_table(values)
    if isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int):
        raise InvalidArgumentError(
            f"snapshot_id must be the snapshot id the values' order refers to (an int), not {snapshot_id!r}: "
            "take it from t.scan_order(branch).snapshot_id or the snapshot you read"
        )
    columns = list(values.column_names)
    check_column_names(columns)
    _check_targets(table, columns)
    key_cols = table.primary_key
    key_table = None
    if keys is not None:
        key_table = to_table(keys) if not isinstance(keys, (pa.Array, pa.ChunkedArray)) else pa.table({key_cols[0]: keys})
        missing = [k for k in key_cols if k not in key_table.column_names]
        if missing:
            raise SchemaMismatchError(f"keys need the key column(s) {key_cols}; missing {missing}", missing)
        key_table = key_table.select(key_cols)
        if key_table.num_rows != values.num_rows:
            raise InvalidArgumentError(f"{key_table.num_rows} keys for {values.num_rows} values: give one key per value")
        key_schema = arrow_schema(table._ice.schema(), field_ids=False)
        key_table = conform_keys(key_table, [key_schema.field(k) for k in key_cols])
        for k in key_cols:  # null keys now; repeated keys only if the merge finds a row without a value (below)
            if key_table.column(k).null_count:
                check_keys(key_table.select([k]), [k])
    report = UpdateReport(columns=columns)
    written: list[str] = []

    def attempt(ice: IcebergTable) -> UpdateReport:
        delete_quietly(ice, written)  # leftovers of an attempt that lost a commit race
        written.clear()
        head = refs.branch_head(ice.metadata, branch)
        if head is None or head.snapshot_id != snapshot_id:
            raise SnapshotMovedError(
                f"{table.name}@{branch} is at snapshot {head.snapshot_id if head else None}, not {snapshot_id}: "
                "values in scan order refer to one snapshot; read the key again and recompute",
                snapshot_id,
                head.snapshot_id if head else None,
            )
        order = scan_order(table, ice, head)
        if values.num_rows != order.total_rows:
            raise InvalidArgumentError(
                f"{values.num_rows} values for {order.total_rows} rows of {table.name}@{snapshot_id}: "
                "a dense column needs one value per row (use backfill for some of the rows)"
            )
        current = arrow_schema(ice.schema(), field_ids=False)
        new_columns = _check_types(current, values, columns, "add_column")
        fitted = fit_values(current, values, columns, new_columns)
        if key_table is None:
            groups = [(path, fitted.slice(start, n)) for path, start, n in order.slices() if n]
        else:
            try:
                groups = _by_key(ice, order, key_table, fitted, key_cols, table.name)
            except UnknownKeyError:
                # As many keys as rows, each row matched: the keys are exactly the table's, so a repeated
                # key always shows up as a row without a value. Say which it is (a sort, paid only here).
                check_keys(key_table, key_cols)
                raise
        if not groups:
            report.snapshot_id = head.snapshot_id
            return report
        return commit_update_files(table, ice, head, branch, fitted, fitted, columns, new_columns, written, report, groups)

    with cleanup_on_failure(table._ice, written, landed=lambda: report.snapshot_id is not None):
        return optimistic(table.refresh, attempt, f"add column to {table.name}@{branch}")


def _check_targets(table: "Table", columns: list[str]) -> None:
    """Refuse columns a dense write cannot set: none, reserved names, the key, partition sources."""
    if not columns:
        raise SchemaMismatchError("no column to set")
    bad = [c for c in columns if c.startswith(RESERVED_PREFIX)]
    if bad:
        raise SchemaMismatchError(f"column names starting with '_' are reserved: {bad}", bad)
    keyed = [c for c in columns if c in table.primary_key]
    if keyed:
        raise SchemaMismatchError(f"the primary key {keyed} cannot be set", keyed)
    schema = table._ice.schema()
    sources = {schema.find_column_name(f.source_id) for f in table._ice.spec().fields}
    frozen = [c for c in columns if c in sources]
    if frozen:
        raise SchemaMismatchError(f"partition source column(s) {frozen} cannot be updated in place", frozen)


def _by_key(
    ice: IcebergTable, order: ScanOrder, key_table: pa.Table, values: pa.Table, key_cols: list[str], name: str
) -> list[tuple[str, pa.Table]]:
    """Each data file's values in its row order, by merging its key column against the sorted input keys."""
    exact = key_is_exact(ice.schema(), key_cols)
    codes = encode(key_table)
    lo, hi = (int(codes.min()), int(codes.max())) if len(codes) else (0, -1)
    if exact and hi - lo < DIRECT_SPAN * len(codes) + 1024:
        # Sample ids are nearly dense: the sort is a counting sort (row of each key at key - lo).
        row_type = np.int32 if len(codes) < 2**31 else np.int64  # half the memory traffic of int64 rows
        slot = np.full(hi - lo + 1, -1, dtype=row_type)
        slot[codes - lo] = np.arange(len(codes), dtype=row_type)

        def rows_of(file_codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            inside = (file_codes >= lo) & (file_codes <= hi)
            rows = np.where(inside, slot[np.clip(file_codes - lo, 0, hi - lo)], -1)
            return np.maximum(rows, 0), rows >= 0
    else:
        by_code = np.argsort(codes, kind="stable")
        sorted_codes = codes[by_code]

        def rows_of(file_codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            at = np.minimum(np.searchsorted(sorted_codes, file_codes), len(sorted_codes) - 1)
            return by_code[at], sorted_codes[at] == file_codes

    def file_values(job: tuple[str, int, int]) -> tuple[str, pa.Table]:
        path, _, n = job
        file_keys = read_key_columns(ice, path, key_cols)
        rows, found = rows_of(encode(file_keys))
        if found.all() and not exact:  # hashed keys: a matching hash must also be the same key
            given = key_table.take(pa.array(rows))
            for k in key_cols:
                found &= pc.fill_null(pc.equal(given.column(k), file_keys.column(k).cast(given.column(k).type)), False).to_numpy(
                    zero_copy_only=False
                )
        if not found.all():
            missing = file_keys.filter(pa.array(~found)).slice(0, 5).to_pylist()
            examples = [r[key_cols[0]] if len(key_cols) == 1 else tuple(r[k] for k in key_cols) for r in missing]
            raise UnknownKeyError(
                f"{int((~found).sum())} row(s) of {name} have no value in the input (e.g. keys {examples}), "
                "and as many input keys are not in the table: a dense column needs every key exactly once",
                examples,
                count=int((~found).sum()),
            )
        return path, values.take(pa.array(rows))

    return run_all(file_values, [s for s in order.slices() if s[2]], WRITE_THREADS)
