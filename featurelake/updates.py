"""Merge-on-read column updates: backfill a feature or label without rewriting data files.

A backfill writes, per touched data file, one *update layer* holding only the
changed columns (Parquet, Iceberg field ids) and the row positions they apply
to (``_pos``, omitted when every row of the file is set); small layers of one
commit share an update file, one row group each (:func:`pack_parts`). The update files
enter the platform state of one new snapshot, in the same atomic commit as any
schema change (new columns). Bytes written are proportional to the new values
(invariant 2); no existing data file is touched.

Rows are found by primary key (a vectorized join against the key columns of
candidate files) or, when the input carries ``_file`` and ``_pos`` from
``read(with_locator=True)``, directly by locator with no lookup at all.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import AssertCurrentSchemaId

from featurelake import refs, sorting
from featurelake.commit import CommitBase, cleanup_on_failure, commit, committed_table, delete_quietly, optimistic
from featurelake.errors import (
    DuplicateKeyError,
    InvalidArgumentError,
    NullKeyError,
    PrimaryKeyError,
    SchemaMismatchError,
    UnknownKeyError,
)
from featurelake.index import encode, key_is_exact, read_key_columns
from featurelake.keys import ROW, check_keys, conform_keys, find
from featurelake.livefiles import remember_files, snapshot_files
from featurelake.schema import (
    LOCATOR_FILE,
    LOCATOR_POS,
    RESERVED_PREFIX,
    _castable,
    arrow_schema,
    cast_column,
    check_column_names,
    check_required,
    stored_type,
    to_table,
)
from featurelake.state import STATE_KEY, StateWriter, UpdateEntry, summary_props
from featurelake.threads import Pending, staged_uploads
from featurelake import updatefiles
from featurelake.updatefiles import (  # noqa: F401  (UpdateFileJob, write_job, WRITE_THREADS: public here as before)
    WRITE_THREADS,
    StoredPart,
    UpdateFileJob,
    pack_parts,
    write_job,
)
from featurelake.wholefiles import WholeFile, uncovered_rows, whole_files

if TYPE_CHECKING:
    from featurelake.table import Table

OnUnknown = Literal["error", "skip"]
# Writes planned update files and returns their sizes in order: (table, jobs, target schema) -> sizes.
UpdateFileWriter = Callable[[IcebergTable, "list[UpdateFileJob]", pa.Schema], "list[int]"]


@dataclass
class UpdateReport:
    """What one backfill or upsert wrote."""

    snapshot_id: int | None = None
    rows_updated: int = 0
    rows_inserted: int = 0
    unknown_skipped: int = 0
    data_files_touched: int = 0
    update_files: int = 0
    bytes_written: int = 0
    columns: list[str] = field(default_factory=list)
    new_columns: list[str] = field(default_factory=list)
    tasks: int = 0  # parallel Ray tasks that wrote the update files (featurelake.ray); 0: written in-process
    whole_files: int = 0  # data files whose every key the input held in row order: set without a key lookup (wholefiles)


def _split_input(table: "Table", data: pa.Table) -> tuple[bool, list[str]]:
    """(by locator?, columns to set), refusing inputs that cannot be a backfill."""
    keys = table.primary_key
    names = data.column_names
    by_locator = LOCATOR_FILE in names and LOCATOR_POS in names
    if not by_locator:
        missing = [k for k in keys if k not in names]
        if missing:
            raise SchemaMismatchError(
                f"backfill input needs the key column(s) {keys} or the locator columns _file and _pos; missing {missing}",
                missing,
            )
    locate_cols = {LOCATOR_FILE, LOCATOR_POS} | ({*keys} if not by_locator else set())
    values = [c for c in names if c not in locate_cols and c not in keys]
    bad = [c for c in values if c.startswith(RESERVED_PREFIX)]
    if bad:
        raise SchemaMismatchError(f"column names starting with '_' are reserved: {bad}", bad)
    if not values:
        raise SchemaMismatchError("backfill input has no column to set besides the key or locator")
    schema = table._ice.schema()
    spec = table._ice.spec()
    partition_sources = {schema.find_column_name(f.source_id) for f in spec.fields}
    frozen = [c for c in values if c in partition_sources]
    if frozen:
        raise SchemaMismatchError(f"partition source column(s) {frozen} cannot be updated in place", frozen)
    return by_locator, values


def _check_types(table_schema: pa.Schema, data: pa.Table, columns: list[str], operation: str = "backfill") -> list[str]:
    """The columns that are new; raise for existing columns of incompatible type."""
    new, wrong = [], []
    for c in columns:
        if c not in table_schema.names:
            t = data.schema.field(c).type
            if pa.types.is_null(t):
                wrong.append(f"new column {c!r} has no type (all nulls of type null)")
            new.append(c)
        elif not _castable(data.schema.field(c).type, table_schema.field(c).type):
            wrong.append(f"column {c!r} is {table_schema.field(c).type}, input has {data.schema.field(c).type}")
    if wrong:
        raise SchemaMismatchError(f"{operation} input does not fit: " + "; ".join(wrong), [w.split("'")[1] for w in wrong])
    return new


def fit_values(current: pa.Schema, data: pa.Table, columns: list[str], new_columns: list[str], *, refuse_required_nulls: bool = True) -> pa.Table:
    """``data`` with ``columns`` cast to the types the lake stores them as, before anything is written.

    Existing columns take the table's type, new ones their stored type
    (``stored_type``: uint64 becomes int64, timestamp[ns] timestamp[us]); a
    value the cast would change is refused, naming the column. Nulls in a
    required column are refused unless ``refuse_required_nulls`` is False
    (upsert: there a null means "keep the row's value").
    """
    required = []
    for c in columns:
        if c in new_columns:
            dtype = stored_type(data.schema.field(c).type, c)
        else:
            dtype = current.field(c).type
            if not current.field(c).nullable:
                required.append(c)
        i = data.column_names.index(c)
        data = data.set_column(i, pa.field(c, dtype), cast_column(data.column(i), dtype, c))
    if refuse_required_nulls:
        check_required([data.column(c) for c in required], [current.field(c) for c in required])
    return data


def _check_keys_unchanged(ice: IcebergTable, groups: list[tuple[str, pa.Table]], keys: list[str]) -> None:
    """Refuse a by-locator backfill whose key columns differ from the keys of the rows it points at."""
    changed, examples = 0, []
    for path, group in groups:
        actual = read_key_columns(ice, path, keys).take(group.column(LOCATOR_POS))
        same = np.ones(group.num_rows, dtype=bool)
        for k in keys:
            given = group.column(k).cast(actual.column(k).type)
            same &= pc.fill_null(pc.equal(actual.column(k), given), False).to_numpy(zero_copy_only=False)
        if not same.all():
            changed += int((~same).sum())
            examples.extend(actual.filter(pa.array(~same)).slice(0, 5).column(keys[0]).to_pylist())
    if changed:
        raise PrimaryKeyError(
            f"{changed} row(s) give key values that differ from the rows their _file/_pos point at "
            f"(e.g. rows with key {examples[:5]}): a backfill cannot change the primary key",
            examples[:5],
            count=changed,
        )


def _locate_by_key(
    table: "Table", ice: IcebergTable, head: Snapshot, data: pa.Table, on_unknown: OnUnknown, report: UpdateReport
) -> list[tuple[str, pa.Table]]:
    """The input rows per data file they set, each in position order.

    Slices of the input that are exactly a data file's keys in row order (keys
    read from the table) are recognised from the key index without a probe
    (featurelake.wholefiles) and set that file densely; the other rows are
    looked up by key. Unknown keys raise or are skipped as ``on_unknown`` says.
    """
    whole = _whole_files(table, ice, head, data)
    report.whole_files = len(whole)
    if not whole:
        return _groups(_probe(table, ice, head, data, on_unknown, report), ordered=True)
    groups = [(w.path, data.slice(w.start, w.rows)) for w in whole]
    ranges = uncovered_rows(data.num_rows, whole)
    if not ranges:
        return groups
    rest = pa.concat_tables([data.slice(a, n) for a, n in ranges]) if len(ranges) > 1 else data.slice(*ranges[0])
    rest_groups = _groups(_probe(table, ice, head, rest, on_unknown, report), ordered=True)
    matched = {w.path for w in whole}
    if any(path in matched for path, _ in rest_groups):  # only if the table held a key twice: locate every row
        report.whole_files = 0
        return _groups(_probe(table, ice, head, data, on_unknown, report), ordered=True)
    return groups + rest_groups


def _whole_files(table: "Table", ice: IcebergTable, head: Snapshot, data: pa.Table) -> list[WholeFile]:
    """The data files whose every key ``data`` holds in their row order, as input slices (single integer keys only)."""
    keys = table.primary_key
    if data.num_rows == 0 or not key_is_exact(ice.schema(), keys):
        return []
    segments = table._state(ice, head).index_segments
    if not segments:
        return []
    live_rows = {path: f.record_count for path, f in snapshot_files(ice, head).items()}
    return whole_files(ice.io, segments, live_rows, encode(data.select(keys)))


def _probe(table: "Table", ice: IcebergTable, head: Snapshot, data: pa.Table, on_unknown: OnUnknown, report: UpdateReport) -> pa.Table:
    """``data``'s rows found by key (``_file``, ``_pos`` added), in (file, position) order."""
    keys = table.primary_key
    found = find(table, ice, head, data.select(keys))
    matched = np.zeros(data.num_rows, dtype=bool)
    matched[found.column(ROW).to_numpy()] = True
    if not matched.all():
        missing = data.select(keys).filter(pa.array(~matched))
        examples = missing.slice(0, 5).to_pylist()
        examples = [r[keys[0]] if len(keys) == 1 else tuple(r[k] for k in keys) for r in examples]
        if on_unknown != "skip":
            raise UnknownKeyError(
                f"{missing.num_rows} key(s) are not in {table.name}@{head.snapshot_id}, e.g. {examples}; "
                "append them first, use upsert, or pass on_unknown='skip'",
                examples,
                count=missing.num_rows,
            )
        report.unknown_skipped = missing.num_rows
    return located_rows(data, found)


def located_rows(data: pa.Table, found: pa.Table) -> pa.Table:
    """The input rows ``find`` located, with their ``_file`` and ``_pos``, in (file, position) order.

    Ordered here, on the three small columns of ``found``, so that the input
    rows are gathered once (``_groups`` then finds them in order); when the
    order is the input's own (keys from a scan of the table), nothing is gathered.
    """
    order = _locator_order(found.column(LOCATOR_FILE), found.column(LOCATOR_POS).to_numpy())
    if order is not None:
        found = found.take(pa.array(order))
    return (
        _gather(data, found.column(ROW).to_numpy())
        .append_column(LOCATOR_FILE, found.column(LOCATOR_FILE))
        .append_column(LOCATOR_POS, found.column(LOCATOR_POS))
    )


_GATHER_RUNS = 64  # up to this many contiguous runs of rows are gathered as zero-copy slices


def _gather(data: pa.Table, rows: np.ndarray) -> pa.Table:
    """``data.take(rows)``; rows that form a few contiguous ascending runs (input
    in scan order, whose data files come in another order) are sliced, not copied."""
    if not len(rows):
        return data.slice(0, 0)
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    if len(breaks) >= _GATHER_RUNS:
        return data.take(pa.array(rows))
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(rows)]])
    parts = [data.slice(int(rows[a]), int(b - a)) for a, b in zip(starts, ends)]
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def _file_indices(files: pa.ChunkedArray | pa.Array) -> pa.DictionaryArray:
    files = files.combine_chunks() if isinstance(files, pa.ChunkedArray) else files
    return files if pa.types.is_dictionary(files.type) else files.dictionary_encode()


_POS_BITS = 40  # (file number << 40) | position sorts by file, then position, in one int64


def _locator_order(files: pa.ChunkedArray | pa.Array, positions: np.ndarray) -> np.ndarray | None:
    """The order that sorts rows by data file (dictionary index), then position; None when sorted already.

    One int64 per row, argsorted (near-linear when already in a few runs:
    featurelake.sorting), instead of a two-key lexsort; positions outside
    ``[0, 2**40)`` (bad locator input, refused later) take the lexsort.
    """
    encoded = _file_indices(files)
    file_idx = encoded.indices.to_numpy(zero_copy_only=False)
    if not len(positions):
        return None
    if positions.dtype.kind != "i" or positions.min() < 0 or positions.max() >= (1 << _POS_BITS) or len(encoded.dictionary) >= (1 << 22):
        order = np.lexsort((positions, file_idx))
        return None if sorting.is_sorted(order) else order
    composite = file_idx.astype(np.int64)
    composite <<= _POS_BITS
    composite |= positions
    return sorting.argsort(composite)


def _check_locators(table: "Table", ice: IcebergTable, head: Snapshot, data: pa.Table) -> list[tuple[str, pa.Table]]:
    """Validate ``_file``/``_pos`` input; returns it grouped per data file (see ``_groups``)."""
    for c in (LOCATOR_FILE, LOCATOR_POS):
        if data.column(c).null_count:
            raise NullKeyError(f"locator column {c!r} holds nulls", count=data.column(c).null_count)
    sizes = {p: f.record_count for p, f in snapshot_files(ice, head).items()}
    groups = _groups(data)
    bad, repeated = [], 0
    for path, group in groups:
        pos = group.column(LOCATOR_POS).to_numpy()
        repeated += int((np.diff(pos) == 0).sum())
        if path not in sizes or pos[0] < 0 or pos[-1] >= sizes[path]:
            bad.append(path)
    if repeated:
        raise DuplicateKeyError(f"{repeated} row locator(s) repeat in the input", count=repeated)
    if bad:
        raise UnknownKeyError(
            f"{len(bad)} locator file(s) are not data files of {table.name}@{head.snapshot_id} "
            f"or positions are out of range, e.g. {bad[:3]}",
            bad[:5],
            count=len(bad),
        )
    return groups


def _groups(rows: pa.Table, ordered: bool = False) -> list[tuple[str, pa.Table]]:
    """Rows split per data file, each sorted by position (``ordered``: they are already, see ``located_rows``)."""
    files = _file_indices(rows.column(LOCATOR_FILE))
    file_idx = files.indices.to_numpy(zero_copy_only=False)
    order = None if ordered else _locator_order(files, rows.column(LOCATOR_POS).to_numpy())
    if order is not None:
        rows = rows.take(pa.array(order))
        file_idx = file_idx[order]
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(file_idx)) + 1, [len(file_idx)]])
    names = files.dictionary
    return [(names[file_idx[a]].as_py(), rows.slice(a, b - a)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def add_columns(tx, data: pa.Table, new_columns: list[str]) -> None:
    """Add ``new_columns`` (typed from ``data``) to the schema inside transaction ``tx``."""
    if new_columns:
        with tx.update_schema() as us:
            us.union_by_name(pa.schema([data.schema.field(c).with_nullable(True) for c in new_columns]))


def stage_update_files(
    table: "Table",
    ice: IcebergTable,
    head: Snapshot,
    writer: StateWriter,
    snapshot_id: int,
    rows: pa.Table,
    columns: list[str],
    schema,
    written: list[str],
    groups: list[tuple[str, pa.Table]] | None = None,
    write_files: "UpdateFileWriter | None" = None,
    pending: "list[Pending] | None" = None,
) -> tuple[int, int, int]:
    """Write the update layers of every touched data file and add them to ``writer``; returns
    (data files touched, update files written, bytes written).

    ``rows`` carry ``_file`` and ``_pos`` plus ``columns``; a data file whose
    every row is set gets a dense layer (no positions). Small layers share
    update files, one row group each (:func:`pack_parts`); large ones keep a
    file of their own. ``write_files`` writes the planned files instead, one
    per data file (featurelake.ray: in Ray tasks). With ``pending`` (and no
    ``write_files``) the uploads may still run when this returns
    (:func:`start_update_files`): their handle is appended there and the
    caller must wait for it before committing.
    """
    target = arrow_schema(schema.select(*columns))
    field_ids = tuple(schema.find_field(c).field_id for c in columns)
    sizes = {p: f.record_count for p, f in snapshot_files(ice, head).items()}
    seq = writer.take_seq()
    parts = [(data_file, group, group.num_rows == sizes[data_file]) for data_file, group in (groups if groups is not None else _groups(rows))]
    planned = pack_parts(parts, target) if write_files is None else [[part] for part in parts]
    files = []
    for members in planned:
        path = f"{table._update_dir(ice)}/{snapshot_id}-{uuid.uuid4().hex[:12]}.parquet"
        files.append([UpdateFileJob(data_file, path, group, dense) for data_file, group, dense in members])
    written.extend(f[0].path for f in files)  # named before any byte is written: a failure anywhere deletes them
    if write_files is not None:
        flat = [f[0] for f in files]
        stored = [[StoredPart(None, size, None)] for size in write_files(ice, flat, target)]
    elif pending is not None:
        stored, uploads = updatefiles.start_update_files(ice, files, target)
        if uploads is not None:
            pending.append(uploads)
    else:
        stored = updatefiles.write_update_files(ice, files, target)
    total = 0
    for jobs, layout in zip(files, stored):
        for job, part in zip(jobs, layout):
            writer.add(UpdateEntry(
                job.data_file, job.path, seq, field_ids, job.dense, job.rows.num_rows, part.bytes, snapshot_id,
                row_group=part.row_group, file_bytes=part.file_bytes,
            ))
        total += layout[0].file_bytes if layout[0].file_bytes is not None else layout[0].bytes
    return len(parts), len(files), total


def apply_column_updates(
    table: "Table",
    data: Any,
    branch: str,
    *,
    on_unknown: OnUnknown = "error",
    write_files: "UpdateFileWriter | None" = None,
) -> UpdateReport:
    """Set columns of existing rows as update files in one commit (backfill, and upsert's update half).

    ``write_files`` writes the planned update files (see :func:`stage_update_files`).
    """
    if on_unknown not in ("error", "skip"):
        raise InvalidArgumentError(f"on_unknown must be 'error' or 'skip', not {on_unknown!r}")
    data = to_table(data)
    check_column_names(data.column_names)
    by_locator, columns = _split_input(table, data)
    keys = table.primary_key
    given_keys = [k for k in keys if k in data.column_names]
    if given_keys:
        key_schema = arrow_schema(table._ice.schema(), field_ids=False)
        data = conform_keys(data, [key_schema.field(k) for k in given_keys])
        for k in given_keys:  # one chunk: the key checks and the index read it as numpy without copying it again
            i = data.column_names.index(k)
            if data.column(i).num_chunks > 1:
                data = data.set_column(i, data.schema.field(i), pa.chunked_array([data.column(i).combine_chunks()]))
    if not by_locator:
        check_keys(data, keys)
    elif given_keys and len(given_keys) < len(keys):
        raise SchemaMismatchError(f"give all key columns {keys} or none with _file/_pos; got {given_keys}", given_keys)
    report = UpdateReport(columns=list(columns))
    written: list[str] = []
    cached, table._base = table._base, None
    base = CommitBase(cached, table.refresh)  # after a read or a backfill of this object: no metadata load (CommitBase)

    def attempt(ice: IcebergTable) -> UpdateReport:
        delete_quietly(ice, written)  # leftovers of an attempt that lost a commit race
        written.clear()
        report.unknown_skipped = report.whole_files = 0  # what an earlier attempt found on older metadata does not count
        head = refs.branch_head(ice.metadata, branch)
        if head is None:
            raise UnknownKeyError(f"{table.name}@{branch} is empty: nothing to backfill", count=data.num_rows)
        current = arrow_schema(ice.schema(), field_ids=False)
        new_columns = _check_types(current, data, columns)
        values = fit_values(current, data, columns, new_columns)
        if by_locator:
            groups = _check_locators(table, ice, head, values)
            if given_keys:
                _check_keys_unchanged(ice, groups, keys)
        else:
            groups = _locate_by_key(table, ice, head, values, on_unknown, report)
        if not groups:
            base.confirm("nothing to backfill")
            report.snapshot_id = head.snapshot_id
            return report
        return commit_update_files(
            table, ice, head, branch, values, values, columns, new_columns, written, report, groups, write_files
        )

    landed = lambda: report.snapshot_id is not None  # noqa: E731
    with cleanup_on_failure(table._ice, written, landed=landed):
        return optimistic(base, base.guard(attempt, landed), f"backfill {table.name}@{branch}")


def stage_snapshot(ice: IcebergTable, writer: StateWriter, root_path: str, props: dict[str, str], producer, pending: list[Pending]) -> None:
    """Start the upload of ``writer``'s state at ``root_path`` and stage ``producer``'s snapshot meanwhile.

    The state's summary (``props``, which the producer reads) is known from
    memory, so the manifest list is written while the state and any update
    files in ``pending`` upload: one round trip on the critical path for all.
    """
    pending.append(writer.start(root_path)[1])
    props.update(summary_props(ice.io, root_path))
    producer.commit()


def commit_update_files(
    table: "Table",
    ice: IcebergTable,
    head: Snapshot,
    branch: str,
    values: pa.Table,
    rows: pa.Table,
    columns: list[str],
    new_columns: list[str],
    written: list[str],
    report: "UpdateReport",
    groups: list[tuple[str, pa.Table]] | None = None,
    write_files: "UpdateFileWriter | None" = None,
) -> "UpdateReport":
    """One backfill commit on ``head``: new columns (typed from ``values``), the update files
    of ``rows`` (or ``groups``), the next platform state, and the snapshot; fills ``report``."""
    tx = ice.transaction()
    # columns were resolved to field ids on this schema: a schema changed meanwhile (a column renamed or
    # soft-deleted by another writer) makes the commit a conflict, retried on a fresh load
    tx._stage((), (AssertCurrentSchemaId(current_schema_id=ice.metadata.current_schema_id),))  # noqa: SLF001
    add_columns(tx, values, new_columns)
    writer = StateWriter(table._state(ice, head), ice.io, table._platform_dir(ice))
    root_path = writer.new_root_path()
    props = {STATE_KEY: root_path, "featurelake.operation": "backfill", "featurelake.columns": ",".join(columns)}
    producer = tx.update_snapshot(snapshot_properties=props, branch=branch).fast_append()
    with staged_uploads() as pending:
        touched, files, total_bytes = stage_update_files(
            table, ice, head, writer, producer.snapshot_id, rows, columns, tx.table_metadata.schema(), written, groups,
            write_files, pending,
        )
        stage_snapshot(ice, writer, root_path, props, producer, pending)
    report.snapshot_id = commit(tx, branch)
    table._base = committed_table(tx, branch, report.snapshot_id)  # the next backfill starts from it
    remember_files(ice, head, report.snapshot_id, [])  # the same data files: the next write plans no manifests
    report.rows_updated = rows.num_rows if groups is None else sum(group.num_rows for _, group in groups)
    report.data_files_touched, report.update_files = touched, files
    report.bytes_written = total_bytes
    report.new_columns = new_columns
    return report
