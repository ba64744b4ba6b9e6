"""Sequence store build records: what one build of a sequence table's store reflects and holds.

Shared by the builder (``seqbuild``) and the reader (``seqlookup``), so neither imports the other's back.
"""
from __future__ import annotations

import base64
import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from featurelake.errors import FeatureLakeError
from featurelake.seqstore import codec_from_dict

BUILD_FORMAT = 1
DEFAULT_THREADS = 4


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
        return [codec_from_dict(d, s, self.chunk_events) for d, s in zip(raw, schemas)]
