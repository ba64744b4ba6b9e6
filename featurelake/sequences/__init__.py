"""Normalized user sequences (Meta's Sequence Storage): store long histories once, join them at read time.

Why: a training row that carries its user's last 256 events copies the same
events into every row of that user; with tens of rows per user the copies
dwarf everything else. Meta keeps a pointer (user id + event time) in the
training row and the user's events once, in a key-value store built offline,
and joins them back in the reader. featurelake does the same:

* **Sequence table** (:class:`SequenceTable`): an ordinary featurelake table
  of events, one row per event, any attribute types. It is the source of
  truth: append, branch and time-travel it like any table. Rows are sorted by
  (user, time) before they are written, so each data file keeps a user's
  events together (better compression; the table's Iceberg sort order says so).
* **Store build** (``st.build()``): the current snapshot becomes a key-value
  store (:mod:`featurelake.sequences.store`): each user's events sorted by time, cut
  into fixed-size chunks (oldest first, ``chunk_events`` per chunk), one value
  per (user, chunk, column group), plus a small per-user head (event count,
  first event time of every chunk). Groups of fixed-width and low-cardinality
  string columns are stored as fixed-size raw chunks (a batch decodes with
  numpy views, no per-chunk work; times delta-coded, values as byte planes);
  groups with lists of fixed-width values as ``packed`` byte planes; others
  (structs, free text) as Arrow IPC messages. By default the fixed-width and
  string columns form the first group and the rest a second one. The sorted
  files are zstd-compressed with a dictionary per file. Written offline into sorted files and bulk-loaded; no
  per-row puts, no compaction. Each build records the snapshot it reflects
  (``<store root>/<build id>/build.json``); an incremental build re-encodes
  only users with new events, from their first affected chunk on, and
  hard-links every other byte from the build it extends.
* **Lookup and join**: ``st.lookup(keys, before, columns, max_len, window)``
  reads the heads of the unique users, picks only the chunks that can hold
  the last ``max_len`` events before ``before`` (inside ``window``), fetches
  them with batched multi-gets in parallel threads, and cuts each row's list
  out of one pool with a single ``take`` per column. ``st.view(...)`` plugs the
  same into ``Table.read/batches(sequences={"hist": view})``.

Strictly-before semantics: a row never sees an event at or after its own
time, so labels cannot leak from the future.

The package is split by concept; this ``__init__`` re-exports the public face:

* :mod:`featurelake.sequences.table` -- :class:`SequenceTable` (identity, appends
  with ordered event ids, build records, lookup, ``view``), creation and
  opening, and the read-time join (:class:`SequenceView`,
  :func:`join_sequences`, :func:`join_sequences_batches`) that
  :mod:`featurelake.table` calls.
* :mod:`featurelake.sequences.build` -- the offline build, full and incremental
  (``SequenceTable.build``).
* :mod:`featurelake.sequences.buildinfo` -- build records (:class:`BuildInfo`), where
  a table's builds live and which ones are live (also used by garbage collection).
* :mod:`featurelake.sequences.collect` -- garbage collection of store builds: the
  dead ones (no retained snapshot is served from them), removed safely
  (``lake.collect_garbage`` calls it).
* :mod:`featurelake.sequences.branching` -- merging branches of an event table as
  the union of the events both sides appended (``SequenceTable.merge``).
* :mod:`featurelake.sequences.layout` -- column groups, codec planning and the
  per-user head and chunk records a build writes.
* :mod:`featurelake.sequences.lookup` -- :class:`SequenceStore`: one build opened
  for serving, and the conversion of keys, times and windows;
  :mod:`featurelake.sequences.gather` -- copying rows' ranges of events out of the
  decoded chunks; :mod:`featurelake.sequences.strings` -- dictionary codes to strings;
  :mod:`featurelake.sequences.search` -- the vectorized searches of a batch (chunks needed, cuts in a chunk).
* :mod:`featurelake.sequences.store` -- the key-value interface, RocksDB behind it,
  and the key codec; :mod:`featurelake.sequences.codecs` -- the fixed and IPC chunk codecs;
  :mod:`featurelake.sequences.packed` -- the
  byte-plane codec for groups with list columns.
* :mod:`featurelake.sequences.features` -- entity feature tables (:class:`FeatureTable`:
  versions of item, author or ad features and embeddings) built into the same store, and
  :mod:`featurelake.sequences.featurejoin` -- their read-time join
  (``Table.read/batches(features={name: view})``, one version per row, as of its time).
"""
from featurelake.sequences.table import *  # noqa: F401,F403
from featurelake.sequences.table import __all__  # noqa: F401
