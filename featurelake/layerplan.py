"""Which thread loads which update layers of a planned read, each once (featurelake.layerload).

A local read of several data files plans their layers before its reader threads start
(:func:`plan_layers`): layers the layer cache holds are taken now; the others get a
:class:`LayerSlot` per data file, loaded by the calling thread in plan order
(``LayerLoading._feed_layers``) or by the reader thread that needs them first. A shared update
file's layers are claimed and decoded together (``LayerLoading._load_parts``). However a load
ends (a damaged file, an interrupt), every claimed layer's future is settled: no reader thread
waits forever.
"""
from __future__ import annotations

import functools
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable

from featurelake import readfiles
from featurelake.errors import FeatureLakeError
from featurelake.state import UpdateEntry

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask

    from featurelake.layerload import LayerLoading

GROUP_BYTES = 8 << 20  # stored bytes of a shared file's layers decoded by one call (the size a shared file is read whole below)


def plan_layers(
    scan: "LayerLoading", tasks: "list[FileScanTask]"
) -> "tuple[list[LayerSlot], list[Callable[[], list]], list[Callable[[], bool] | None]]":
    """Per task, a call returning its layers and a call saying whether they can be taken without
    waiting on another thread (None: always); and the slots of the layers still to load, for the
    calling thread to feed.

    Layers the cache holds are looked up now (a cached read makes no slot, so nobody waits on
    anything); a file with layers to load gets a :class:`LayerSlot`. A data file whose update
    files cannot even be listed (a damaged state shard) or are gone gets a call that raises that
    error, so it fails (or is skipped under the budget) as its read would have.
    """
    slots: list[LayerSlot] = []
    pendings: list[Callable[[], list]] = []
    readies: list[Callable[[], bool] | None] = []
    plan = _Plan()
    for t in tasks:
        readies.append(None)
        try:
            wanted = scan._wanted(t.file.file_path)
            if not wanted:
                pendings.append(_no_layers)
                continue
            cached = [scan._cached_layer(e) for e in wanted]
        except Exception as e:
            failed: Future = Future()
            failed.set_exception(e)
            pendings.append(failed.result)
            continue
        if all(layer is not None for layer in cached):
            pendings.append(functools.partial(list, cached))
            continue
        slot = LayerSlot(scan, wanted, plan, cached)
        slots.append(slot)
        pendings.append(slot.get)
        readies[-1] = slot.ready
    return slots, pendings, readies


def _no_layers() -> list:
    return []


class _Plan:
    """What the slots of one planned read share: the lock claims are made under, and per shared update
    file (and columns) the layers of it the read still has to load, as (slot, index) in plan order."""

    __slots__ = ("claims", "parts")

    def __init__(self) -> None:
        self.claims = threading.Lock()
        self.parts: "dict[tuple, list[tuple[LayerSlot, int]]]" = {}


def _part_group(entry: UpdateEntry) -> tuple:
    return (entry.update_file, entry.field_ids, entry.dense)


class LayerSlot:
    """One data file's update layers, each loaded once by whichever thread claims it first: the
    calling thread feeding them in plan order, or the reader thread that needs them (:meth:`get`).
    Layers the cache already held at planning are there from the start (no claim, no future).

    A layer that is a row group of a shared update file is claimed together with the read's other
    layers of that file still unclaimed, and they are decoded in one call
    (:meth:`LayerLoading._load_parts`). Otherwise claims are per update file, so a reader thread
    waits at most for the one file another thread is decoding at that moment.
    """

    __slots__ = ("scan", "wanted", "plan", "layers", "futures")

    def __init__(self, scan: "LayerLoading", wanted: list[UpdateEntry], plan: _Plan, cached: "list[tuple | None]") -> None:
        self.scan = scan
        self.wanted = wanted
        self.plan = plan
        self.layers = cached  # per layer: loaded (from the cache at planning), else None
        self.futures: "dict[int, Future | None]" = {i: None for i, layer in enumerate(cached) if layer is None}  # None: unclaimed
        for i in self.futures:
            if wanted[i].row_group is not None:
                plan.parts.setdefault(_part_group(wanted[i]), []).append((self, i))

    def _claim(self, i: int) -> "Future | None":
        """A new future for layer ``i`` when this thread is the first to claim it, else None."""
        with self.plan.claims:
            if self.futures[i] is not None:
                return None
            future = self.futures[i] = Future()
            return future

    def load(self) -> None:
        """Load the layers no other thread claimed; errors go to whoever waits on them."""
        for i in self.futures:
            entry = self.wanted[i]
            together = self.plan.parts.get(_part_group(entry)) if entry.row_group is not None else None
            if together is not None and len(together) > 1:
                _load_together(self.scan, self.plan, together)
                continue
            future = self._claim(i)
            if future is not None:
                _settle(future, self.scan._load_layer, entry)

    def ready(self) -> bool:
        """Whether :meth:`get` would return without waiting on another thread: the layers nobody
        has claimed are loaded here first."""
        self.load()
        return all(f.done() for f in self.futures.values())  # type: ignore[union-attr]

    def get(self) -> list:
        """The layers, oldest first: those no thread has started on loaded here, the others waited for."""
        if self.futures:
            self.load()
        layers = self.layers
        return [layer if layer is not None else self.futures[i].result() for i, layer in enumerate(layers)]  # type: ignore[union-attr]

    def fail(self) -> None:
        """Fail the layers no thread ever claimed (the feeding thread was interrupted)."""
        for i in self.futures:
            future = self._claim(i)
            if future is not None:
                future.set_exception(_interrupted())


def _interrupted() -> FeatureLakeError:
    return FeatureLakeError("the read was interrupted before this file's update layers were loaded")


def _settle(future: Future, load: Callable, entry: UpdateEntry) -> None:
    """``future`` set to ``load(entry)`` or its error; an interrupt still interrupts this thread."""
    try:
        layer = load(entry)
    except BaseException as e:  # whoever waits gets it
        future.set_exception(e)
        if not isinstance(e, Exception):
            raise
    else:
        future.set_result(layer)


def _load_together(scan: "LayerLoading", plan: _Plan, together: "list[tuple[LayerSlot, int]]") -> None:
    """Claim the layers of one shared update file that no thread has claimed yet, and load them in
    as few calls as :func:`_chunks` allows; a call that fails is redone layer by layer (each data file
    then gets its own layer's error)."""
    with plan.claims:
        mine = [(slot, i) for slot, i in together if slot.futures[i] is None]
        for slot, i in mine:
            slot.futures[i] = Future()
    if not mine:
        return
    futures: list[Future] = [slot.futures[i] for slot, i in mine]  # type: ignore[misc]
    try:
        for chunk in _chunks(mine):
            entries = [slot.wanted[i] for slot, i in chunk]
            try:
                layers = scan._load_parts(entries) if len(chunk) > 1 else None
            except Exception:
                layers = None
            for k, (slot, i) in enumerate(chunk):
                if layers is not None:
                    slot.futures[i].set_result(layers[k])  # type: ignore[union-attr]
                else:
                    _settle(slot.futures[i], scan._load_layer, entries[k])  # type: ignore[arg-type]
    finally:  # interrupted: nobody waits forever on the layers claimed here
        for future in futures:
            if not future.done():
                future.set_exception(_interrupted())


def _chunks(claimed: "list[tuple[LayerSlot, int]]") -> "list[list[tuple[LayerSlot, int]]]":
    """``claimed`` in runs decoded by one call each: up to :data:`GROUP_BYTES` stored bytes a run, and
    at most a 32nd of the layer cache's budget, so that the layer cache keeps each run (it keeps
    nothing above an eighth of its budget, and decoded values take up to ~4x their stored bytes)."""
    budget = readfiles.LAYERS.budget
    limit = min(GROUP_BYTES, budget // 32) if budget else GROUP_BYTES  # no cache: nothing to keep, one call pays anyway
    runs: list[list] = []
    used = limit + 1
    for slot, i in claimed:
        size = slot.wanted[i].bytes or 0
        if used + size > limit:
            runs.append([])
            used = 0
        runs[-1].append((slot, i))
        used += size
    return runs


def fail_unfed(slots: "list[LayerSlot]") -> None:
    """Fail the slots nobody claimed (the feeding thread was interrupted: no reader waits forever)."""
    for slot in slots:
        slot.fail()
