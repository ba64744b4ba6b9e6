"""Sequence store build records: what one build of a sequence table's store reflects and holds.

Also where a table's builds live and which of them a retained snapshot is served from, as plain
functions of the table's name, Iceberg table and the lake's cache folder. Shared by the builder
(``sequences.build``), the reader (``sequences.lookup``), :class:`~featurelake.sequences.SequenceTable` and
garbage collection (``gc``), so none of them imports another's back.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from featurelake import refs
from featurelake.errors import FeatureLakeError
from featurelake.sequences.packed import PackedCodec
from featurelake.sequences.codecs import codec_from_dict
from featurelake.storage import storage_of

BUILD_FORMAT = 2          # 2: two-level heads for users with more than HEAD_FANOUT chunks
READ_FORMATS = (1, 2)     # format 1 heads are format 2 heads of users that never needed a second level
DEFAULT_THREADS = 4

PROP_KEY = "featurelake.sequence.key"
PROP_TIME = "featurelake.sequence.time"
PROP_EVENT_ID = "featurelake.sequence.event-id"
PROP_SYNTHETIC = "featurelake.sequence.event-id-synthetic"
STORE_DIR = "sequence-store"  # under the table's folder when the lake has no home


class SequenceBuildError(FeatureLakeError):
    """No store build reflects the snapshot asked for, or a build cannot be made."""


@dataclasses.dataclass
class BuildInfo:
    """One store build: the snapshot it reflects, where it lives, what it holds.

    ``layers`` are sorted-file paths relative to the build folder, oldest
    layer first; ``bytes`` counts this build's new files, ``store_bytes`` all
    layers (shared layers are hard links, so disk use is lower).
    """

    build_id: str
    table: str
    snapshot_id: int
    branch: str | None
    created_at: str
    key: str
    time: str
    key_type: str
    time_type: str
    chunk_events: int
    column_groups: list[list[str]]
    group_schemas: list[str]
    store: dict
    layers: list[list[str]]
    users: int
    events: int
    chunks: int
    bytes: int
    store_bytes: int
    group_codecs: list[dict] = dataclasses.field(default_factory=list)
    codec_mode: str = "auto"
    columns: list[str] = dataclasses.field(default_factory=list)  # time + attributes, in table order
    incremental: bool = False
    base_build: str | None = None
    new_events: int = 0
    affected_users: int = 0
    seconds: float = 0.0
    tasks: int = 0  # parallel Ray tasks that wrote the sorted files (featurelake.ray); 0: built in-process
    table_uuid: str = ""  # the Iceberg table's uuid: garbage collection never deletes another table's build
    tier_after: int = 0   # >0: each user's chunks before its newest tier_after are cold (featurelake.sequences.tiering)
    cold_segments: list[dict] = dataclasses.field(default_factory=list)  # {"path", "bytes", "base"} per segment
    cold_bytes: int = 0   # bytes of the cold segments this build reads (its own and its base's)
    format: int = BUILD_FORMAT
    path: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("group_schemas")
        d["group_codecs"] = [c.get("kind", "ipc") for c in self.group_codecs]
        return d

    @property
    def db_dir(self) -> str:
        return str(Path(self.path) / "db")

    def layout(self) -> tuple:
        """What must match for an incremental build to extend this one."""
        return (self.key, self.time, self.key_type, self.time_type, self.chunk_events,
                self.column_groups, self.group_schemas, self.store, self.codec_mode)

    def schemas(self) -> list[pa.Schema]:
        return [ipc.read_schema(pa.py_buffer(base64.b64decode(s))) for s in self.group_schemas]

    def codecs(self) -> list:
        schemas = self.schemas()
        raw = self.group_codecs or [{"kind": "ipc"}] * len(schemas)
        return [codec_of(d, s, self.chunk_events) for d, s in zip(raw, schemas)]


def codec_of(d: dict, schema: pa.Schema, chunk_events: int):
    """The chunk codec a build recorded for one column group (fixed, packed or Arrow IPC)."""
    if d.get("kind") == "packed":
        return PackedCodec(schema, d.get("delta", ()))
    return codec_from_dict(d, schema, chunk_events)


def load_build(path: Path) -> BuildInfo:
    """The build recorded in ``<path>/build.json``."""
    raw = json.loads((path / "build.json").read_text())
    raw["path"] = str(path)
    known = {f.name for f in dataclasses.fields(BuildInfo)}
    return BuildInfo(**{k: v for k, v in raw.items() if k in known})


def store_root(cache_dir: str | Path | None, name: str, ice: Any) -> Path:
    """Where the store builds of table ``name`` (Iceberg table ``ice``) live (RocksDB needs a local disk).

    ``<cache_dir>/sequences/<table>``: the embedded lake's home, or the
    cache folder of a lake on a catalog (``Lake(..., cache_dir=...)`` or
    ``$FEATURELAKE_CACHE_DIR``). Without one: ``$FEATURELAKE_SEQUENCE_HOME/<table>``,
    or next to the table when its location is a local folder.
    """
    if cache_dir is not None:
        return Path(cache_dir) / "sequences" / name
    env = os.environ.get("FEATURELAKE_SEQUENCE_HOME")
    if env:
        return Path(env) / name
    loc = ice.location()
    local = storage_of(ice.io).local_path(loc)
    if local is not None:  # garbage collection keeps its live builds (see live_builds)
        return Path(local) / STORE_DIR
    raise SequenceBuildError(
        f"{name} lives at {loc}: its sequence store needs a local folder: "
        "set FEATURELAKE_CACHE_DIR or open the lake with cache_dir=..."
    )


def list_builds(root: Path) -> list[BuildInfo]:
    """Every finished build under the store root ``root``, oldest first."""
    if not root.exists():
        return []
    out = []
    for d in sorted(root.iterdir()):
        if d.is_dir() and not d.name.startswith(".") and (d / "build.json").exists():
            try:
                out.append(load_build(d))
            except (OSError, ValueError, TypeError):
                continue  # a damaged record: ignored, like an unfinished build
    return sorted(out, key=lambda b: (b.created_at, b.build_id))


def _keeps_events(snapshot: Any) -> bool:
    """Whether a snapshot only rewrote files (compaction, index rebuild, Iceberg 'replace')."""
    summary = snapshot.summary
    if summary is None:
        return False
    if summary.get("featurelake.operation") in refs.CONTENT_PRESERVING:
        return True
    return summary.operation.value == "replace"


def build_serving(meta: Any, snap: Any, all_builds: list[BuildInfo]) -> BuildInfo | None:
    """The newest build of ``snap``, or of the ancestor it shares its events with."""
    # A compaction or an index rebuild changes files, not events: a build of the snapshot
    # before it still serves (so maintenance never takes the store away from training reads),
    # also once that snapshot expired: the commit names it (refs.same_events_props).
    def newest_of(snapshot_id: int) -> BuildInfo | None:
        matching = [b for b in all_builds if b.snapshot_id == snapshot_id]
        return matching[-1] if matching else None

    for candidate in refs.ancestors(meta, snap):
        found = newest_of(candidate.snapshot_id)
        if found is not None:
            return found
        if not _keeps_events(candidate):
            break
        named = candidate.summary.get(refs.SAME_EVENTS_AS) if candidate.summary is not None else None
        if named and meta.snapshot_by_id(int(named)) is None:  # expired: only its builds tell
            return newest_of(int(named))
    return None


def live_builds(meta: Any, all_builds: list[BuildInfo]) -> list[BuildInfo]:
    """The builds a snapshot retained in ``meta`` (any branch or tag) may be served from; garbage collection keeps these.

    That is the build each retained snapshot resolves to (see :func:`build_serving`:
    its own newest build, or the one of the ancestor it shares its events with),
    and the newest build of each retained snapshot in every layout (a reader may
    pin one by id, e.g. to compare column groups). Builds of expired snapshots
    that no retained one needs, and older builds of a snapshot superseded by a
    newer one in the same layout (``build(force=True)``), are dead.
    """
    retained = {s.snapshot_id for s in meta.snapshots}
    live: dict[str, BuildInfo] = {}
    newest: dict[tuple, BuildInfo] = {}
    for b in all_builds:  # oldest first: the last one of a (snapshot, layout) wins
        if b.snapshot_id in retained:
            newest[(b.snapshot_id, repr(b.layout()))] = b
    live.update((b.build_id, b) for b in newest.values())
    for snap in meta.snapshots:
        found = build_serving(meta, snap, all_builds)
        if found is not None:
            live[found.build_id] = found
    return sorted(live.values(), key=lambda b: (b.created_at, b.build_id))
