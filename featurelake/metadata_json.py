"""Writing table metadata JSON without re-serialising every schema of the table's history.

Each commit writes a new metadata.json holding *every* schema the table ever
had. pyiceberg serialises each field's type through a Python callback, so the
cost grows with the schema history: a 71-column table after 16 new-column
writes (17 schemas, 1,343 fields) took 31 ms to serialise, of which 2 ms was
everything but the schemas, on every later commit.

A schema object never changes (pyiceberg's models are frozen), and the
lake's catalog hands the metadata it wrote to the next commit, whose new
metadata shares the same schema objects. So each schema's JSON is kept per
schema *object* (by identity, checked through a weak reference: a schema
staged by a commit that lost its race is another object and can never lend
its JSON to a different schema with the same id; comparing schemas by value
costs a third of serialising them). The document is the same JSON object
pyiceberg writes, with ``schemas`` first (key order carries no meaning in
JSON; tests/test_write_settings.py checks every key and value against
pyiceberg's own serialisation).

Used by the lake's SQL catalog only (``featurelake.lake``); other catalogs and
plain pyiceberg keep pyiceberg's writer.
"""
from __future__ import annotations

import threading
import weakref

from pyiceberg.io import OutputFile
from pyiceberg.schema import Schema
from pyiceberg.serializers import Compressor, ToOutputFile
from pyiceberg.table.metadata import TableMetadata, TableMetadataV2
from pyiceberg.utils.config import Config

MAX_SCHEMAS = 4096  # cached schema documents (a few KB each)

_cache: dict[tuple, tuple[weakref.ref, str]] = {}
_lock = threading.Lock()


def schema_json(schema: Schema, exclude_none: bool) -> str:
    """The JSON of one schema as pyiceberg writes it inside table metadata (cached per schema object)."""
    key = (id(schema), exclude_none)
    found = _cache.get(key)
    if found is not None and found[0]() is schema:
        return found[1]
    text = schema.model_dump_json(exclude_none=exclude_none)
    try:
        ref = weakref.ref(schema)
    except TypeError:  # cannot be referenced weakly: not cached
        return text
    with _lock:
        if len(_cache) >= MAX_SCHEMAS:
            _cache.clear()
        _cache[key] = (ref, text)
    return text


def metadata_json(metadata: TableMetadata, exclude_none: bool = True) -> str:
    """``metadata.model_dump_json(exclude_none=...)``, with each schema's JSON taken from the cache."""
    if not isinstance(metadata, TableMetadataV2) or not metadata.schemas:
        return metadata.model_dump_json(exclude_none=exclude_none)
    rest = metadata.model_dump_json(exclude_none=exclude_none, exclude={"schemas"})
    if not rest.startswith("{"):  # not an object: leave it to pyiceberg
        return metadata.model_dump_json(exclude_none=exclude_none)
    schemas = '"schemas":[' + ",".join(schema_json(s, exclude_none) for s in metadata.schemas) + "]"
    return "{" + schemas + "}" if rest == "{}" else "{" + schemas + "," + rest[1:]


def write_table_metadata(metadata: TableMetadata, output_file: OutputFile, overwrite: bool = False) -> None:
    """``ToOutputFile.table_metadata`` with :func:`metadata_json` (same options, compression and bytes on read)."""
    if not isinstance(metadata, TableMetadataV2):
        ToOutputFile.table_metadata(metadata, output_file, overwrite)
        return
    with output_file.create(overwrite=overwrite) as output_stream:
        # as pyiceberg: None values are kept only for the legacy current-snapshot-id of -1
        exclude_none = False if Config().get_bool("legacy-current-snapshot-id") else True
        json_bytes = metadata_json(metadata, exclude_none).encode("utf-8")
        json_bytes = Compressor.get_compressor(output_file.location).bytes_compressor()(json_bytes)
        output_stream.write(json_bytes)
