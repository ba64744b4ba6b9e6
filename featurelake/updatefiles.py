"""Writing a commit's update files: its layers planned into files, encoded and stored.

Small layers of one commit share an update file, one row group each (:func:`pack_parts`): a
small file costs a reader ~150 us of CPU to open, check and decode on a first read whatever its
size, and a writer one PUT on an object store. Large layers keep a file of their own. The files
are ordinary Parquet in the table's data folder with the data files' writer settings
(featurelake.writer_settings, datafiles.update_file_settings); featurelake.updates plans the
layers and records where each landed in the platform state (``state.UpdateEntry.row_group``).
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.table import Table as IcebergTable

from featurelake.datafiles import update_file_settings
from featurelake.errors import FeatureLakeError
from featurelake.layerload import POS_FIELD_ID
from featurelake.schema import LOCATOR_POS
from featurelake.storage import SINGLE_PUT_BYTES, storage_of
from featurelake.threads import MAX_THREADS, Pending, run_all, start_all
from featurelake.writer_settings import WriterSettings

WRITE_THREADS = 8  # update files written at once by one commit (object-store latency, not CPU, is the limit)


def _part_table(values: pa.Table, target: pa.Schema, positions: pa.Array | None, required: frozenset[str] = frozenset()) -> pa.Table:
    """One part's rows as stored: only the given columns, plus ``_pos`` unless dense; the ``required``
    ones (no nulls in any part of the file: :func:`_required`) as required Parquet columns."""
    arrays, fields = [], []
    if positions is not None:
        arrays.append(positions.cast(pa.int64()))
        fields.append(pa.field(LOCATOR_POS, pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_FIELD_ID).encode()}))
    for f in target:
        arrays.append(values.column(f.name).cast(f.type))
        fields.append(f.with_nullable(f.name not in required))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _required(parts: "list[pa.Table]", target: pa.Schema) -> frozenset[str]:
    """The columns of ``target`` that hold no null in any of ``parts``: stored as required columns,
    which a reader decodes without definition levels (a quarter of a small sparse layer's decode
    time). One file's parts share one schema, so it is decided for the whole file."""
    return frozenset(f.name for f in target if all(part.column(f.name).null_count == 0 for part in parts))


def _settings(ice: IcebergTable, table: pa.Table) -> dict:
    # the data files' codec (featurelake.writer_settings), only where it pays (datafiles.update_file_settings)
    return update_file_settings(table, WriterSettings.of(ice.metadata.properties).compression)


def encode_update_file(ice: IcebergTable, values: pa.Table, target: pa.Schema, positions: pa.Array | None) -> pa.Buffer:
    """One update file's bytes (only the given columns, plus ``_pos`` unless dense)."""
    out_table = _part_table(values, target, positions, _required([values], target))
    sink = pa.BufferOutputStream()
    pq.write_table(out_table, sink, **_settings(ice, out_table))
    return sink.getvalue()


def upload_update_file(ice: IcebergTable, path: str, data: pa.Buffer) -> int:
    """Store an encoded update file as the new file ``path``; returns its size."""
    return storage_of(ice.io).write_bytes(path, data)


def write_update_file(ice: IcebergTable, path: str, values: pa.Table, target: pa.Schema, positions: pa.Array | None) -> int:
    """Write one update file (only the given columns, plus ``_pos`` unless dense); return its size."""
    return upload_update_file(ice, path, encode_update_file(ice, values, target, positions))


@dataclass(frozen=True)
class UpdateFileJob:
    """One data file's update layer to write: ``rows`` (``_pos`` plus values) for ``data_file``, into
    the update file at ``path`` (jobs of a shared file name the same path, in row-group order)."""

    data_file: str
    path: str
    rows: pa.Table
    dense: bool


@dataclass(frozen=True)
class StoredPart:
    """Where one job's layer landed: its row group of a shared file (None: a file of its own), its
    stored bytes, and the shared file's size (None: ``bytes`` is the whole file)."""

    row_group: int | None
    bytes: int
    file_bytes: int | None


# A layer whose stored columns take at most this much in memory (Arrow bytes, before encoding: known
# without encoding it) shares an update file with the commit's other small layers. Opening, checking
# and decoding a small file costs ~150 us of CPU on a first read whatever its size (pyarrow's own floor
# is 70-110 us), and each is one PUT on an object store; from a few MB the bytes themselves cost more
# than that (decoding 4 MiB takes ms, uploading it tens of ms), so a larger layer gains nothing by
# sharing and keeps its own file. The same size below which a local update file is read whole
# (layerload.SMALL_LAYER_FILE_BYTES).
PACK_PART_BYTES = 4 << 20
PACK_FILE_BYTES = SINGLE_PUT_BYTES  # a shared update file takes small layers up to this many bytes: one PUT
PACK_MAX_ROWS = 1 << 20  # Parquet writers cap a row group's rows (pyarrow: 1Mi); a layer with more keeps its own file


def _layer_bytes(rows: pa.Table, target: pa.Schema, dense: bool) -> int:
    return sum(rows.column(f.name).nbytes for f in target) + (0 if dense else 8 * rows.num_rows)


def pack_parts(parts: "list[tuple[str, pa.Table, bool]]", target: pa.Schema) -> "list[list[tuple[str, pa.Table, bool]]]":
    """(data file, rows, dense) layers grouped into update files, in order: small layers (at most
    :data:`PACK_PART_BYTES`) together up to :data:`PACK_FILE_BYTES` a file, large ones alone.

    Layers share a file only when they share its Parquet schema: one commit's layers have the same
    columns, and dense ones no ``_pos`` column, so dense and sparse layers go to separate files.
    """
    files: list[list] = []
    open_files: dict[bool, tuple[list, int]] = {}
    for part in parts:
        _, rows, dense = part
        size = _layer_bytes(rows, target, dense)
        if size > PACK_PART_BYTES or rows.num_rows > PACK_MAX_ROWS:
            files.append([part])
            continue
        members, used = open_files.get(dense, (None, 0))
        if members is None or used + size > PACK_FILE_BYTES:
            members, used = [], 0
            files.append(members)
        members.append(part)
        open_files[dense] = (members, used + size)
    return files


def encode_file(ice: IcebergTable, jobs: list[UpdateFileJob], target: pa.Schema) -> tuple[pa.Buffer, list[StoredPart]]:
    """The bytes of one update file holding ``jobs`` (several: one row group each), and where each landed."""
    if len(jobs) == 1:
        data = encode_update_file(ice, jobs[0].rows, target, _job_positions(jobs[0]))
        return data, [StoredPart(None, data.size, None)]
    required = _required([job.rows for job in jobs], target)
    tables = [_part_table(job.rows, target, _job_positions(job), required) for job in jobs]
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, tables[0].schema, **_settings(ice, tables[0])) as out:
        for t in tables:
            out.write_table(t, row_group_size=t.num_rows)
    data = sink.getvalue()
    meta = pq.read_metadata(pa.BufferReader(data))
    if meta.num_row_groups != len(jobs) or any(meta.row_group(i).num_rows != t.num_rows for i, t in enumerate(tables)):
        raise FeatureLakeError(f"a shared update file came out with {meta.num_row_groups} row groups for {len(jobs)} layers")
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    stored = [sum(g.column(j).total_compressed_size for j in range(g.num_columns)) for g in groups]
    return data, [StoredPart(i, n, data.size) for i, n in enumerate(stored)]


def write_update_files(ice: IcebergTable, files: list[list[UpdateFileJob]], target: pa.Schema) -> list[list[StoredPart]]:
    """Write the update files ``files`` (each a list of jobs, see :func:`pack_parts`) in this process;
    returns where each job landed, in order.

    Parquet encoding and the upload release the GIL, so the files of one commit
    are written in parallel threads; every write has finished (or failed)
    before this returns or raises.
    """
    def write(jobs: list[UpdateFileJob]) -> list[StoredPart]:
        data, stored = encode_file(ice, jobs, target)
        upload_update_file(ice, jobs[0].path, data)
        return stored

    return run_all(write, files, WRITE_THREADS)


def write_job(ice: IcebergTable, job: UpdateFileJob, target: pa.Schema) -> int:
    """Write one job's update file (positions only when it is not dense); returns its size."""
    return write_update_file(ice, job.path, job.rows, target, _job_positions(job))


def _job_positions(job: UpdateFileJob) -> pa.Array | None:
    return None if job.dense else job.rows.column(LOCATOR_POS).combine_chunks()


# Background uploads leave pool workers free: the state's pack uploads meanwhile (state.StateWriter.write),
# not queued behind every update file.
UPLOAD_THREADS = max(1, MAX_THREADS - 2)
BACKGROUND_BYTES = 256 << 20  # up to this many input bytes, update files are encoded in memory and uploaded in the background


def start_update_files(
    ice: IcebergTable, files: list[list[UpdateFileJob]], target: pa.Schema
) -> tuple[list[list[StoredPart]], Pending | None]:
    """Encode the update files ``files`` now and start their uploads; returns (where each job landed, pending uploads).

    The sizes (for the platform state) are known once the bytes are encoded,
    so the state and the snapshot's manifest list are written while the
    uploads run; the caller waits for them (``Pending.wait``) before the
    catalog commit, and on any failure before deleting what was written.
    Inputs larger than :data:`BACKGROUND_BYTES` are written as before
    (:func:`write_update_files`, pending None): the encoded files are not
    all held in memory at once.
    """
    if sum(job.rows.nbytes for jobs in files for job in jobs) > BACKGROUND_BYTES:
        return write_update_files(ice, files, target), None
    encoded = run_all(lambda jobs: encode_file(ice, jobs, target), files, WRITE_THREADS)
    pending = start_all(lambda pair: upload_update_file(ice, pair[0][0].path, pair[1][0]), list(zip(files, encoded)), UPLOAD_THREADS)
    return [layout for _, layout in encoded], pending
