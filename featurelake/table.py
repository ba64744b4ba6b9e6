"""A sample table: the public face of one Iceberg table in the lake.

``Table`` validates input, then hands the work to the module that owns the
concept (reading to ``read``, whole-row writes to ``appends``, column updates to ``updates``, branches to
``branches``, maintenance to ``maintenance``). Every write is one atomic
Iceberg commit on one branch and returns its snapshot id.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import pyarrow as pa
from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from featurelake import refs
from featurelake.appends import write_rows
from featurelake.errors import InvalidArgumentError
from featurelake.guard import storage_errors, track
from featurelake.health import SMALL_FILE_BYTES, SMALL_FILE_PROPERTY
from featurelake import index
from featurelake.keys import verify_index
from featurelake.livefiles import snapshot_files
from featurelake.filters import parse_filter
from featurelake.read import DEFAULT_BATCH, Scan
from featurelake.schema import arrow_schema
from featurelake.state import PlatformState, distinct_files, state_of, summary_props
from featurelake.storage import platform_dir, storage_of

if TYPE_CHECKING:
    from featurelake.lake import Lake

MAIN = refs.MAIN


class Table:
    """A featurelake table (see DESIGN.md for the API contract)."""

    def __init__(self, lake: "Lake", name: str, ice: IcebergTable) -> None:
        self.lake = lake
        self.name = name
        self._ice = ice
        # the newest metadata this object has seen with no commit of its own since (a backfill starts from it: CommitBase)
        self._base: IcebergTable | None = None
        storage_of(ice.io)  # its S3 writes become single PUTs (featurelake.storage)

    # ------------------------------------------------------------ identity
    @property
    def iceberg(self) -> IcebergTable:
        """The underlying pyiceberg Table, refreshed (for interop)."""
        return self.refresh()

    def refresh(self) -> IcebergTable:
        """Load the table's current metadata from the catalog (a fresh FileIO, see featurelake.guard)."""
        with storage_errors(f"load {self.name}"):
            ice = self.lake.catalog.load_table(self.name)
        track(ice.io)
        storage_of(ice.io)
        self._ice = ice
        self._base = None  # the operation that loads it may commit
        return ice

    @property
    def primary_key(self) -> list[str]:
        declared = self._ice.metadata.properties.get("featurelake.primary-key")
        if declared:
            return declared.split(",")
        schema = self._ice.schema()
        return [schema.find_column_name(i) for i in schema.identifier_field_ids]

    @property
    def schema(self) -> pa.Schema:
        """The table's current Arrow schema."""
        return arrow_schema(self.refresh().schema(), field_ids=False)

    def __repr__(self) -> str:
        return f"Table({self.name!r})"

    # ---------------------------------------------------------------- state
    def _state(self, ice: IcebergTable, snapshot: Snapshot | None) -> PlatformState:
        return state_of(ice.metadata, ice.io, snapshot)

    def _state_props(self, ice: IcebergTable, head: Snapshot | None, root: str | None = None) -> dict[str, str]:
        """Snapshot summary carrying the platform state forward (new root, or the inherited one)."""
        if root is None:
            root = self._state(ice, head).root_path
        return summary_props(ice.io, root)

    def _platform_dir(self, ice: IcebergTable) -> str:
        return platform_dir(ice.location())

    def _update_dir(self, ice: IcebergTable) -> str:
        return f"{ice.location().rstrip('/')}/data/_updates"

    # --------------------------------------------------------------- reading
    def scan(
        self,
        columns: Sequence[str] | None = None,
        filter: str | BooleanExpression | None = None,
        branch: str = MAIN,
        snapshot_id: int | None = None,
        with_locator: bool = False,
        max_bad_file_ratio: float = 0.0,
        batch_size: int = DEFAULT_BATCH,
        ice: IcebergTable | None = None,
        include_hidden: bool = False,
    ) -> Scan:
        """A snapshot-consistent scan, planned lazily (``.tasks()``, ``.to_table()``, ``.report``)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be a positive integer, not {batch_size!r}")
        if ice is None:
            ice = self.refresh()
            self._base = ice  # a read commits nothing: reading the keys to set is a backfill's usual prelude
        meta = ice.metadata
        snapshot = refs.resolve(meta, branch, snapshot_id)
        if snapshot_id is not None and snapshot is not None and snapshot.schema_id is not None:
            schema = meta.schema_by_id(snapshot.schema_id) or meta.schema()
        else:
            schema = meta.schema()
        return Scan(
            self,
            snapshot,
            schema,
            self._state(ice, snapshot),
            columns=columns,
            filter=filter,
            with_locator=with_locator,
            max_bad_file_ratio=max_bad_file_ratio,
            batch_size=batch_size,
            include_hidden=include_hidden,
            ice=ice,
        )

    @storage_errors("read")
    def read(
        self,
        columns: Sequence[str] | None = None,
        filter: str | BooleanExpression | None = None,
        branch: str = MAIN,
        snapshot_id: int | None = None,
        with_locator: bool = False,
        max_bad_file_ratio: float = 0.0,
        sequences: dict[str, Any] | None = None,
        features: dict[str, Any] | None = None,
    ) -> pa.Table:
        """Read a branch, tag or snapshot with update files merged in; ``sequences=``, ``features=``: read-time joins."""
        extra: list[str] = []
        if sequences or features:  # the joins need their key and time columns: read them, drop them after
            from featurelake.sequences.featurejoin import plan_joins

            columns, extra = plan_joins(columns, sequences, features)
        scan = self.scan(columns, filter, branch, snapshot_id, with_locator, max_bad_file_ratio)
        result = scan.to_table()
        self.last_read_report = scan.report
        if sequences or features:
            from featurelake.sequences.featurejoin import apply_joins

            result = apply_joins(result, sequences, features, drop=extra)
        return result

    def to_pandas(
        self,
        columns: Sequence[str] | None = None,
        filter: str | BooleanExpression | None = None,
        branch: str = MAIN,
        snapshot_id: int | None = None,
        with_locator: bool = False,
        max_bad_file_ratio: float = 0.0,
        sequences: dict[str, Any] | None = None,
        features: dict[str, Any] | None = None,
    ):
        """``read(...)`` as a pandas DataFrame (same arguments, update files merged in)."""
        return self.read(columns, filter, branch, snapshot_id, with_locator, max_bad_file_ratio, sequences,
                         features).to_pandas()

    def to_polars(
        self,
        columns: Sequence[str] | None = None,
        filter: str | BooleanExpression | None = None,
        branch: str = MAIN,
        snapshot_id: int | None = None,
        with_locator: bool = False,
        max_bad_file_ratio: float = 0.0,
        sequences: dict[str, Any] | None = None,
        features: dict[str, Any] | None = None,
    ):
        """``read(...)`` as a polars DataFrame (same arguments); polars is imported only here."""
        try:
            import polars as pl
        except ImportError as e:
            raise InvalidArgumentError("to_polars needs polars: pip install polars") from e
        return pl.from_arrow(self.read(columns, filter, branch, snapshot_id, with_locator, max_bad_file_ratio, sequences,
                                       features))

    def batches(
        self,
        columns: Sequence[str] | None = None,
        filter: str | BooleanExpression | None = None,
        branch: str = MAIN,
        batch_size: int = DEFAULT_BATCH,
        shuffle: bool = False,
        seed: int = 0,
        sample: float | None = None,
        max_bad_file_ratio: float = 0.0,
        snapshot_id: int | None = None,
        with_locator: bool = False,
        sequences: dict[str, Any] | None = None,
        features: dict[str, Any] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Stream record batches with bounded memory (files are read one or two ahead); joins as in ``read``."""
        extra: list[str] = []
        if sequences or features:  # the joins need their key and time columns: read them, drop them after
            from featurelake.sequences.featurejoin import plan_joins

            columns, extra = plan_joins(columns, sequences, features)
        scan = self.scan(columns, filter, branch, snapshot_id, with_locator, max_bad_file_ratio, batch_size)
        self.last_read_report = scan.report
        stream = scan.to_batches(shuffle=shuffle, seed=seed, sample=sample)
        if sequences or features:
            from featurelake.sequences.featurejoin import apply_joins_batches

            schema = scan.output_schema if features else None  # feature views are checked now, not at the first batch
            return apply_joins_batches(stream, sequences, features, drop=extra, schema=schema)
        return stream

    # --------------------------------------------------------------- writing
    @storage_errors("append")
    def append(self, data: Any, branch: str = MAIN) -> int | None:
        """Append rows; refuse null keys and keys already in the batch or the branch.

        ``data`` is a pyarrow Table or RecordBatch, a pandas DataFrame, or an
        iterable of batches (streamed: written in chunks, committed once).
        Returns the new snapshot id (the current head when ``data`` is empty).
        """
        return write_rows(self, data, branch, replace_filter=None)

    @storage_errors("overwrite")
    def overwrite(self, data: Any, filter: str | BooleanExpression, branch: str = MAIN) -> int | None:
        """Atomically replace the rows matching ``filter`` with ``data`` (one commit).

        Used to re-materialize a partition: running it twice never duplicates.
        """
        return write_rows(self, data, branch, replace_filter=parse_filter(filter))

    @storage_errors("delete")
    def delete(self, filter: str | BooleanExpression, branch: str = MAIN) -> int | None:
        """Delete the rows matching ``filter`` (evaluated on merged values)."""
        return write_rows(self, None, branch, replace_filter=parse_filter(filter))

    @storage_errors("backfill")
    def backfill(self, data: Any, branch: str = MAIN, on_unknown: str = "error") -> int | None:
        """Set columns of existing rows without rewriting any data file (one commit).

        ``data`` holds the key column(s), or ``_file`` and ``_pos`` from
        ``read(with_locator=True)``, plus the columns to set; columns not yet
        in the schema are added. Unknown keys raise UnknownKeyError unless
        ``on_unknown="skip"``. The report is kept in ``last_update_report``.
        """
        from featurelake.updates import apply_column_updates

        report = apply_column_updates(self, data, branch, on_unknown=on_unknown)
        self.last_update_report = report
        return report.snapshot_id

    def scan_order(self, branch: str = MAIN, snapshot_id: int | None = None):
        """The table's row order at a snapshot (the head of ``branch`` unless ``snapshot_id``).

        Returns a ``featurelake.dense.ScanOrder``: ``snapshot_id``, ``files``
        (data files in planning order) and ``rows`` (rows per file). It is the
        row order of ``read(columns=[key], snapshot_id=...)``: files in that
        order, each file's rows in position order. Values computed in that
        order can be written back with :meth:`add_column`.
        """
        from featurelake.dense import scan_order

        ice = self.refresh()
        return scan_order(self, ice, refs.resolve(ice.metadata, branch, snapshot_id))

    @storage_errors("add column")
    def add_column(self, name: str, values: Any, snapshot_id: int, branch: str = MAIN, keys: Any = None) -> int | None:
        """Set column ``name`` (new or existing) for every row in one commit, without a key lookup.

        ``values`` (an Arrow array, or anything ``pa.array`` takes) are in the
        scan order of ``snapshot_id`` (see :meth:`scan_order`): the order of
        ``read(columns=[key], snapshot_id=snapshot_id)``. ``snapshot_id`` must
        be the head of ``branch``, else SnapshotMovedError; one value per row,
        else InvalidArgumentError, and nothing is written. With ``keys`` (the
        key column values, one per value, any order, every key of the
        snapshot exactly once) the values are matched by a sort-merge instead.
        Each data file gets one dense update file. The report is kept in
        ``last_update_report``.
        """
        from featurelake.dense import write_dense

        if not isinstance(name, str):
            raise InvalidArgumentError(f"column name must be a string, not {name!r}")
        if isinstance(values, pa.Table):
            if values.num_columns != 1:
                raise InvalidArgumentError(f"add_column takes one column of values, got {values.num_columns}")
            values = values.column(0)
        elif not isinstance(values, (pa.Array, pa.ChunkedArray)):
            try:
                values = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
                raise InvalidArgumentError(f"add_column values must be an array of one type: {e}") from e
        report = write_dense(self, pa.table({name: values}), snapshot_id, branch, keys)
        self.last_update_report = report
        return report.snapshot_id

    @storage_errors("compact")
    def compact(self, branch: str = MAIN, **options: Any):
        """Fold update files into rewritten data files and bin-pack small files (one commit).

        Afterwards plain Iceberg readers see exactly what featurelake reads.
        Returns a CompactionReport.
        """
        from featurelake.maintenance import compact

        return compact(self, branch, **options)

    # ------------------------------------------------------------ branches
    @storage_errors("create branch")
    def create_branch(self, name: str, from_ref: str | int = MAIN) -> int:
        """Zero-copy branch at a branch, tag or snapshot id; returns the snapshot it starts at."""
        from featurelake.branches import create_branch

        return create_branch(self, name, from_ref)

    @storage_errors("create tag")
    def create_tag(self, name: str, ref: str | int = MAIN) -> int:
        from featurelake.branches import create_tag

        return create_tag(self, name, ref)

    def branches(self) -> dict[str, int]:
        """Branch name -> head snapshot id."""
        from featurelake.branches import list_branches

        return list_branches(self)

    def tags(self) -> dict[str, int]:
        from featurelake.branches import list_tags

        return list_tags(self)

    @storage_errors("drop branch")
    def drop_branch(self, name: str) -> None:
        from featurelake.branches import drop_ref

        drop_ref(self, name)

    @storage_errors("merge")
    def merge(self, source: str | int, into: str = MAIN) -> int:
        """Merge a branch (or tag or snapshot) into ``into``: fast-forward or three-way, one commit.

        Raises MergeConflictError naming the data files and columns both sides changed.
        """
        from featurelake.merge import merge

        return merge(self, source, into)

    @storage_errors("rebase")
    def rebase(self, branch: str, onto: str = MAIN) -> int:
        """Replay ``branch``'s changes on ``onto``'s head and move the branch there."""
        from featurelake.merge import rebase

        return rebase(self, branch, onto)

    def diff(self, branch: str, against: str = MAIN) -> dict[str, Any]:
        """Rows, columns, files and bytes ``branch`` added since it forked from ``against``."""
        from featurelake.merge import diff

        return diff(self, branch, against)

    @storage_errors("drop tag")
    def drop_tag(self, name: str) -> None:
        from featurelake.branches import SnapshotRefType, drop_ref

        drop_ref(self, name, SnapshotRefType.TAG)

    # --------------------------------------------------------- maintenance
    @storage_errors("expire snapshots")
    def expire_snapshots(self, older_than: datetime, retain_last: int = 1) -> list[int]:
        """Expire old snapshots (ref heads and the last ``retain_last`` per branch stay)."""
        from featurelake.gc import expire_snapshots

        return expire_snapshots(self, older_than, retain_last)

    @storage_errors("revert")
    def revert(self, snapshot_id: int, branch: str = MAIN) -> int:
        """Undo one snapshot's operation in a new snapshot, keeping every later one.

        Raises RevertDependencyError naming a later snapshot that builds on it.
        """
        from featurelake.revert import revert

        return revert(self, snapshot_id, branch)

    def soft_delete_column(self, name: str) -> str:
        """Hide a feature column (a rename to a reserved name); returns the hidden name."""
        from featurelake.columns import soft_delete_column

        return soft_delete_column(self, name)

    def restore_column(self, name: str) -> None:
        """Bring a soft-deleted column back with its data and updates."""
        from featurelake.columns import restore_column

        restore_column(self, name)

    def purge_column(self, name: str, grace: timedelta = timedelta(days=7)) -> None:
        """Drop a soft-deleted column from the schema after the grace period."""
        from featurelake.columns import purge_column

        purge_column(self, name, grace)

    @storage_errors("upsert")
    def upsert(self, data: Any, branch: str = MAIN) -> int | None:
        """Update rows whose key exists (merge-on-read) and insert new keys, in one commit.

        Existing rows keep their partition; the report is in ``last_update_report``.
        """
        from featurelake.upsert import upsert

        report = upsert(self, data, branch)
        self.last_update_report = report
        return report.snapshot_id

    def rebuild_index(self, branch: str = MAIN) -> dict:
        """Rebuild the key index of a branch from its data files."""
        return index.rebuild(self, branch)

    def verify_index(self, branch: str = MAIN, snapshot_id: int | None = None) -> dict:
        """Check the key index against the data (``ok`` is True when it is right)."""
        return verify_index(self, branch, snapshot_id)

    # ---------------------------------------------------------- inspection
    @storage_errors("stats")
    def stats(self, branch: str = MAIN, snapshot_id: int | None = None) -> dict[str, Any]:
        """Rows, files and bytes of a branch head (cheap: manifests and platform state only)."""
        ice = self.refresh()
        snapshot = refs.resolve(ice.metadata, branch, snapshot_id)
        state = self._state(ice, snapshot)
        files = list(snapshot_files(ice, snapshot).values())
        layers = state.by_data_file([f.file_path for f in files]) if not state.empty else {}
        small = int(ice.metadata.properties.get(SMALL_FILE_PROPERTY, SMALL_FILE_BYTES))
        data_bytes = sum(f.file_size_in_bytes for f in files)
        update_bytes = sum(e.bytes for es in layers.values() for e in es)
        return {
            "table": self.name,
            "branch": branch,
            "snapshot_id": snapshot.snapshot_id if snapshot else None,
            "rows": sum(f.record_count for f in files),
            "data_files": len(files),
            "small_files": sum(1 for f in files if f.file_size_in_bytes < small),
            "update_files": distinct_files(e for es in layers.values() for e in es),  # a shared file once
            "max_update_layers": max((len(es) for es in layers.values()), default=0),
            "data_bytes": data_bytes,
            "update_bytes": update_bytes,
            "bytes": data_bytes + update_bytes,
            "snapshots": sum(1 for _ in refs.ancestors(ice.metadata, snapshot)),
            "columns": len(ice.schema().fields),
            # what engines reading the Iceberg metadata directly get: final only without pending update files
            "metadata_location": ice.metadata_location,
            "final_for_external_readers": not any(layers.values()),
            **(self._storage(branch, ice) if snapshot_id is None and snapshot is not None else {}),
        }

    def _storage(self, branch: str, ice: IcebergTable | None = None) -> dict[str, int]:
        from featurelake.merge import storage

        return storage(self, branch, ice)

    @storage_errors("snapshots")
    def snapshots(self, branch: str = MAIN) -> list[dict[str, Any]]:
        """The branch's history, newest first: id, time, operation, summary."""
        ice = self.refresh()
        head = refs.resolve(ice.metadata, branch)
        out = []
        for snap in refs.ancestors(ice.metadata, head):
            summary = snap.summary.additional_properties if snap.summary else {}
            out.append(
                {
                    "snapshot_id": snap.snapshot_id,
                    "parent_id": snap.parent_snapshot_id,
                    "timestamp": datetime.fromtimestamp(snap.timestamp_ms / 1000).isoformat(timespec="seconds"),
                    "operation": summary.get("featurelake.operation", snap.summary.operation.value if snap.summary else ""),
                    "added_rows": int(summary.get("added-records", 0)),
                    "total_rows": int(summary.get("total-records", 0)),
                }
            )
        return out
