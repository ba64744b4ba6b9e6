"""What another process needs to read a table without its catalog: a planned scan's reading half, views, table refs.

Why: reads run in processes that never see the catalog (Ray tasks and
actors, data-loader workers started with ``spawn``). The catalog (a SQLite
or PostgreSQL engine, a REST session) does not pickle and must not be shared,
and a worker never commits. So the process that plans ships, for a fixed
snapshot, exactly what reading needs: the scan's projection, filter and
schema, the update layers of the files it will read, and the storage
properties its FileIO is rebuilt from (so the worker uses the catalog's own
storage configuration). Sequence and feature views travel as their build
record plus the join's arguments and reopen their store in the worker (the
store must be on a path the worker can reach).

Each worker process builds each FileIO, table and view once (module caches).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pyiceberg.io import FileIO, load_file_io
from pyiceberg.table import Table as IcebergTable

from featurelake.read import ReadReport, Scan

_FILE_IOS: dict[tuple, FileIO] = {}
_TABLES: dict[str, IcebergTable] = {}
_VIEWS: dict[tuple, Any] = {}


def file_io(properties: dict[str, str]) -> FileIO:
    """A FileIO built from a catalog FileIO's properties, once per worker process."""
    key = tuple(sorted(properties.items()))
    if key not in _FILE_IOS:
        _FILE_IOS[key] = load_file_io(dict(properties))
    return _FILE_IOS[key]


@dataclass(frozen=True)
class TableRef:
    """A table as a worker sees it: metadata and storage, no catalog (workers never commit)."""

    identifier: tuple
    metadata: Any
    metadata_location: str
    io_properties: dict

    @classmethod
    def of(cls, ice: IcebergTable) -> "TableRef":
        return cls(tuple(ice.name()), ice.metadata, ice.metadata_location, dict(ice.io.properties))

    def table(self) -> IcebergTable:
        found = _TABLES.get(self.metadata_location)
        if found is None:
            if len(_TABLES) > 64:
                _TABLES.clear()
            found = _TABLES[self.metadata_location] = IcebergTable(
                self.identifier, self.metadata, self.metadata_location, file_io(self.io_properties), catalog=None  # type: ignore[arg-type]
            )
        return found


class Layers:
    """The update layers of a few data files, resolved by the planner (a worker reads no platform state)."""

    def __init__(self, entries: dict) -> None:
        self.entries = entries

    @property
    def empty(self) -> bool:
        return not self.entries

    def entries_for(self, data_file: str) -> list:
        return self.entries.get(data_file, [])


_PLANNER_ONLY = ("table", "ice", "io", "state", "_tasks", "report")


class ShippedScan:
    """The reading half of a planned :class:`Scan`, for some of its files, picklable for a worker."""

    def __init__(self, scan: Scan, files: Sequence[str]) -> None:
        self.fields = {k: v for k, v in vars(scan).items() if k not in _PLANNER_ONLY}
        self.io_properties = dict(scan.io.properties)
        self.entries = scan.state.by_data_file(list(files)) if not scan.state.empty else {}

    def open(self) -> Scan:
        scan = object.__new__(Scan)
        scan.__dict__.update(self.fields)
        scan.table = scan.ice = scan._tasks = None
        scan.io = file_io(self.io_properties)
        scan.state = Layers(self.entries)
        scan.report = ReadReport()
        return scan


class ShippedView:
    """A sequence or feature view, reopened in the worker from its build record and the join's arguments."""

    def __init__(self, view: Any) -> None:
        from featurelake.sequences.featurejoin import FeatureView

        self.info = view.store.info
        io = getattr(view.store, "io", None)
        self.io_properties = None if io is None else dict(io.properties)  # the FileIO itself holds closures
        self.kind = "features" if isinstance(view, FeatureView) else "sequences"
        if self.kind == "features":
            self.args: tuple = (view.table, view.key, view.time, list(view.columns), dict(view.embeddings), view.threads,
                                view.batch_keys)
        else:
            self.args = (view.key, view.time, list(view.columns), view.max_len, view.window, view.threads, view.batch_keys,
                         view.layout, view.cache_bytes)

    def open(self) -> Any:
        from featurelake.sequences import SequenceView
        from featurelake.sequences.featurejoin import FeatureView
        from featurelake.sequences.lookup import SequenceStore

        key = (self.kind, self.info.path, repr(self.args))
        if key not in _VIEWS:
            store = SequenceStore(self.info, io=None if self.io_properties is None else file_io(self.io_properties))
            _VIEWS[key] = FeatureView(store, *self.args) if self.kind == "features" else SequenceView(store, *self.args)
        return _VIEWS[key]
