"""Normalized entity feature tables: item, author or ad features and embeddings, stored once, joined at read time.

Why: a training row that carries its item's features and a 64-float
embedding copies them into every row that shows the item; with thousands of
rows per item the copies dwarf everything else, and a corrected embedding
means rewriting every row. Meta's stated next step for Sequence Storage is
to keep such entity features once, keyed by the entity, and join them back
in the reader. featurelake does it with the sequence machinery itself:

* **Feature table** (:class:`FeatureTable`): a featurelake table with one
  row per *version* of an entity's features: the key (int or string), an
  optional version time, and the features (any types; embeddings declared
  as fixed-size lists ``pa.list_(pa.float32(), dim)``, stored in Iceberg as
  lists whose length ``append`` checks). It is a
  :class:`~featurelake.sequences.SequenceTable` whose "events" are versions:
  append, branch, time-travel it like any table. Without a time column
  (``time=None``) later appends of a key replace earlier ones (a hidden
  ``feature_version`` column counts appends).
* **Build** (``ft.build()``): the sequence store build, unchanged: each
  entity's versions sorted by time, in small chunks (8 versions), scalar
  features in a fixed-size column group, embeddings and other nested
  columns in a second group; incremental after appends.
* **View and join** (``ft.view(columns, key_column, as_of)``): a
  :class:`~featurelake.sequences.featurejoin.FeatureView` for
  ``t.read/batches(features={"item": view})``. Each row gets, per feature,
  the value of the entity's last version strictly before the row's
  ``as_of`` time (no version at or after it ever leaks in), or of the latest
  version when ``as_of`` is None; nulls when the key is null or has no such
  version. One column per feature, ``"item.<feature>"``; embeddings as
  ``pa.FixedSizeListArray``, zero-copy to numpy.

Ties: two versions of one key at the same time are ordered by append (the
later append wins).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from featurelake.errors import FeatureLakeError, SchemaMismatchError, TableNotFoundError
from featurelake.sequences.build import build_store
from featurelake.sequences.buildinfo import DEFAULT_THREADS, BuildInfo, SequenceBuildError
from featurelake.sequences.featurejoin import FeatureView
from featurelake.sequences.arguments import as_array
from featurelake.sequences.lookup import DEFAULT_BATCH_KEYS
from featurelake.sequences.codecs import fixed_dtype, is_string
from featurelake.sequences.table import SequenceTable, create_sequence_table
from featurelake.table import MAIN
from featurelake.appends import input_chunks

if TYPE_CHECKING:
    from featurelake.lake import Lake

PROP_KIND = "featurelake.sequence.kind"              # "features" marks a feature table
PROP_FEATURE_TIME = "featurelake.features.time"      # the version time column, "" when unversioned
PROP_EMBEDDINGS = "featurelake.features.embeddings"  # JSON {column: dimension}
VERSION = "feature_version"  # unversioned tables: the append order, the store's time axis
ROW_ID = "feature_row_id"    # the synthetic primary key every featurelake table needs
DEFAULT_FEATURE_CHUNK = 8  # versions per chunk: a lookup decodes one chunk per row


def create_feature_table(
    lake: "Lake",
    name: str,
    schema: pa.Schema,
    key: str,
    time: str | None = None,
    partition_by: Sequence[str] = (),
    properties: dict[str, str] | None = None,
) -> "FeatureTable":
    """Create a feature table keyed by ``key`` (an entity: item, author, ad), versioned by ``time``.

    ``schema`` holds the key, the time column if any, and the features;
    declare embeddings as fixed-size lists (``pa.list_(pa.float32(), 64)``).
    ``time=None``: one live version per key, the last appended.
    """
    if not isinstance(schema, pa.Schema):
        raise SchemaMismatchError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    if not isinstance(key, str) or key not in schema.names:
        raise SchemaMismatchError(f"feature key column {key!r} is not in the schema {schema.names}", [str(key)])
    kt = schema.field(key).type
    if not (pa.types.is_integer(kt) or pa.types.is_string(kt) or pa.types.is_large_string(kt)):
        raise SchemaMismatchError(f"feature key column {key!r} must be an integer or string column, not {kt}", [key])
    if time is not None:
        if time not in schema.names:
            raise SchemaMismatchError(f"feature time column {time!r} is not in the schema {schema.names}", [time])
        if time == key:
            raise SchemaMismatchError("the key and time columns must differ", [key])
    reserved = [c for c in (VERSION, ROW_ID) if c in schema.names]
    if reserved:
        raise SchemaMismatchError(f"column name(s) {reserved} are reserved by feature tables", reserved)
    if len(set(schema.names)) != len(schema.names):
        raise SchemaMismatchError(f"the schema repeats a column name: {schema.names}")
    features = [n for n in schema.names if n not in (key, time)]
    if not features:
        raise SchemaMismatchError("a feature table needs at least one feature column besides the key and time")
    dims: dict[str, int] = {}
    fields = []
    for f in schema:
        if pa.types.is_fixed_size_list(f.type):
            if f.type.list_size < 1:
                raise SchemaMismatchError(f"embedding column {f.name!r} must have a dimension of at least 1", [f.name])
            dims[f.name] = f.type.list_size
            f = f.with_type(pa.list_(f.type.value_field))  # Iceberg has no fixed-size list: the length is a property
        fields.append(f)
    if time is None:
        fields.append(pa.field(VERSION, pa.int64(), nullable=False))
    props = {
        PROP_KIND: "features",
        PROP_FEATURE_TIME: time or "",
        PROP_EMBEDDINGS: json.dumps(dims, sort_keys=True),
    }
    props.update(properties or {})
    st = create_sequence_table(lake, name, pa.schema(fields), key, time or VERSION, partition_by, props, event_id=ROW_ID)
    return FeatureTable(lake, name, st.iceberg)


def open_feature_table(lake: "Lake", name: str) -> "FeatureTable":
    """Open an existing feature table; a clear error for other tables."""
    table = lake.table(name)
    if table.iceberg.metadata.properties.get(PROP_KIND) != "features":
        raise TableNotFoundError(f"{name!r} is a table but not a feature table (create it with create_feature_table)")
    return FeatureTable(lake, name, table.iceberg)


class FeatureTable(SequenceTable):
    """Versions of entity features plus their serving store (see the module docstring)."""

    # ------------------------------------------------------------ identity
    @property
    def version_time(self) -> str | None:
        """The column that times versions, or None (then the last append of a key wins)."""
        return self._props.get(PROP_FEATURE_TIME) or None

    @property
    def versioned(self) -> bool:
        return self.version_time is not None

    @property
    def embeddings(self) -> dict[str, int]:
        """Embedding columns and their dimensions."""
        return json.loads(self._props.get(PROP_EMBEDDINGS) or "{}")

    @property
    def features(self) -> list[str]:
        """The feature columns, in table order."""
        skip = {self.key, self.time, self.event_id}
        return [n for n in self.schema.names if n not in skip]

    def __repr__(self) -> str:
        return f"FeatureTable({self.name!r}, key={self.key!r}, time={self.version_time!r})"

    # -------------------------------------------------------------- writing
    def append(self, data: Any, branch: str = MAIN) -> int | None:
        """Append versions: the key (and time) must be set; embeddings must have their declared length.

        Without a time column, each row is a new version of its key and the
        last one appended wins.
        """
        return super().append(data, branch=branch)

    def _prepared_events(self, data: Any, base: int) -> Iterator[pa.Table]:
        if self.versioned:
            yield from super()._prepared_events(self._conformed(data), base)
            return
        for chunk in self._conformed(data):
            if VERSION in chunk.column_names:
                raise SchemaMismatchError(f"{VERSION!r} is assigned by the feature table; leave it out", [VERSION])
            n = chunk.num_rows
            chunk = chunk.append_column(VERSION, pa.array(np.arange(base, base + n, dtype=np.int64)))
            yield from super()._prepared_events(chunk, base)
            base += n

    def _conformed(self, data: Any) -> Iterator[pa.Table]:
        """Input chunks with embeddings checked (declared length, as lists) and cast to the stored list type."""
        dims = self.embeddings
        schema = self.schema
        for chunk in input_chunks(data):
            if isinstance(chunk, pa.RecordBatch):
                chunk = pa.Table.from_batches([chunk])
            for col, dim in dims.items():
                if col not in chunk.column_names:
                    continue
                arr = chunk.column(col).combine_chunks()
                t = arr.type
                if pa.types.is_fixed_size_list(t):
                    if t.list_size != dim:
                        raise SchemaMismatchError(f"embedding {col!r} has dimension {dim}, the data {t.list_size}", [col])
                elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
                    lengths = pc.list_value_length(arr)
                    bad = pc.sum(pc.not_equal(lengths, dim)).as_py() or 0
                    if bad:
                        raise SchemaMismatchError(f"{bad} value(s) of embedding {col!r} do not hold {dim} numbers", [col])
                else:
                    raise SchemaMismatchError(f"embedding {col!r} must be a list of {dim} numbers, not {t}", [col])
                target = schema.field(col).type
                try:
                    arr = arr.cast(target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                    raise SchemaMismatchError(f"embedding {col!r} of type {t} does not fit {target}: {e}", [col]) from e
                chunk = chunk.set_column(chunk.column_names.index(col), pa.field(col, target), arr)
            yield chunk

    # --------------------------------------------------------------- builds
    def build(self, branch: str = MAIN, snapshot_id: int | None = None, **options: Any) -> BuildInfo:
        """Build the serving store for a branch head (or a snapshot); incremental after appends.

        The options are those of the sequence build
        (:func:`featurelake.sequences.build.build_store`). A first build
        defaults to chunks of ``DEFAULT_FEATURE_CHUNK`` versions, with scalar
        features in one column group and embeddings and other nested columns
        in another (scalars then decode with numpy views).
        """
        builds = self.builds()
        if not builds:
            options.setdefault("chunk_events", DEFAULT_FEATURE_CHUNK)
            if options.get("column_groups") is None:
                options["column_groups"] = self._default_groups()
        elif all(options.get(k) is None for k in ("chunk_events", "column_groups", "codecs")):
            last = builds[-1]
            if sorted(c for g in last.column_groups for c in g) != sorted(self.features):  # features were added
                options.update(chunk_events=last.chunk_events, column_groups=self._default_groups(), codecs=last.codec_mode)
        return build_store(self, branch, snapshot_id, **options)

    def _default_groups(self) -> list[list[str]]:
        schema = self.schema
        flat = [n for n in self.features if fixed_dtype(schema.field(n).type) is not None or is_string(schema.field(n).type)]
        nested = [n for n in self.features if n not in flat]
        return [g for g in (flat, nested) if g]

    def build_for(self, branch: str = MAIN, snapshot_id: int | None = None, build: str | None = None) -> BuildInfo:
        try:
            return super().build_for(branch, snapshot_id, build)
        except SequenceBuildError as e:
            raise SequenceBuildError(f"feature table {self.name}: {e}".replace("sequence store build", "store build")) from None

    # ---------------------------------------------------------------- reads
    def view(  # type: ignore[override]
        self,
        columns: Sequence[str] | None = None,
        key_column: str | None = None,
        as_of: str | None = None,
        branch: str = MAIN,
        snapshot_id: int | None = None,
        build: str | None = None,
        threads: int = DEFAULT_THREADS,
        batch_keys: int = DEFAULT_BATCH_KEYS,
    ) -> FeatureView:
        """A join spec for ``Table.read/batches(features={name: view})``.

        ``key_column`` names the training table's column holding the entity
        key (default: this table's key name); ``as_of`` its time column: each
        row gets the last version strictly before that time. ``as_of=None``
        joins the latest version (no point-in-time guarantee). ``columns``
        picks features (default all; the version time column may be asked
        for too). The build is resolved now: every batch of an epoch sees
        the same store.
        """
        cols = self._check_columns(columns)
        if as_of is not None and not self.versioned:
            raise FeatureLakeError(f"{self.name} has no version time (created with time=None): as_of cannot apply")
        if as_of is not None and not isinstance(as_of, str):
            raise FeatureLakeError(f"as_of names the training table's time column, not {as_of!r}")
        key_column = self.key if key_column is None else key_column
        if not isinstance(key_column, str):
            raise FeatureLakeError(f"key_column names the training table's key column, not {key_column!r}")
        store = self.open_store(branch, snapshot_id, build)
        store.check_columns(cols)
        return FeatureView(store, self.name, key_column, as_of, cols, self.embeddings, threads, batch_keys)

    def _check_columns(self, columns: Sequence[str] | None) -> list[str]:
        allowed = self.features + ([self.time] if self.versioned else [])
        if columns is None:
            return list(self.features)
        if isinstance(columns, str):
            columns = [columns]
        columns = list(columns)
        if not columns:
            raise SchemaMismatchError("columns must name at least one feature (None: all)")
        bad = [c for c in columns if c not in allowed]
        if bad:
            raise SchemaMismatchError(f"unknown feature column(s) {bad} of {self.name}; features: {allowed}", bad)
        if len(set(columns)) != len(columns):
            raise SchemaMismatchError(f"columns repeat a name: {columns}")
        return columns

    def lookup(  # type: ignore[override]
        self,
        keys: Any,
        as_of: Any = None,
        columns: Sequence[str] | None = None,
        branch: str = MAIN,
        snapshot_id: int | None = None,
        build: str | None = None,
        threads: int = DEFAULT_THREADS,
    ) -> pa.Table:
        """The features of ``keys`` (one row per key, in order) as of ``as_of`` (one time, one per key, or None: latest).

        Returns a table with one column per feature (no prefix); nulls where
        a key is null, unknown, or has no version strictly before its time.
        """
        view = self.view(columns, None, None, branch, snapshot_id, build, threads)
        if as_of is not None and not self.versioned:
            raise FeatureLakeError(f"{self.name} has no version time (created with time=None): as_of cannot apply")
        cols = view.join(as_array(keys, view.store.key_type), as_of)
        self.last_lookup_stats = dict(view.stats)
        return pa.table(cols, schema=pa.schema([view.field(c) for c in view.columns]))


__all__ = [
    "DEFAULT_FEATURE_CHUNK",
    "PROP_EMBEDDINGS",
    "PROP_FEATURE_TIME",
    "PROP_KIND",
    "FeatureTable",
    "FeatureView",
    "create_feature_table",
    "open_feature_table",
]
