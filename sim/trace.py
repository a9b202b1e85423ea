"""The trace schema: one event table shared by the simulator, the kernel's telemetry and the app.

One row per interval: on GPU `rank` (on `node`), actor `lane` of `role` (a processor block, a
scheduler or subscriber warp, a node's proxy thread, a NIC, a link), doing `kind` of work from
`start` to `end` nanoseconds, about `expert`, `tile` and `peer` (-1 where none), moving `bytes`.
`lane` numbers the actors of one role on one rank (processor block 0.., subscriber warp 0..,
link lane = peer rank). The kernel's subscriber "wait" event is one expert's enqueue: its local
expert in `peer`, the tasks it queued in `tile`. Saved as `.npz` columns plus a JSON `meta` (who produced it, config,
preset: the versioned schema below, which both producers fill and readers check); exported to
Chrome/Perfetto JSON (`ph: "X"`, microseconds) for ui.perfetto.dev.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reference.files import FileError, finite, json_of_array, json_text, load_npz

ROLES = ("processor", "scheduler", "subscriber", "proxy", "nic", "link")
KINDS = ("gate", "dispatch", "gemm0", "gemm1", "combine", "put", "fence", "signal", "wait", "idle")
COLUMNS = {
    "rank": np.int32, "node": np.int32, "lane": np.int32, "role": np.int8, "kind": np.int8,
    "start": np.float64, "end": np.float64, "expert": np.int32, "tile": np.int32,
    "peer": np.int32, "bytes": np.int64,
}
ROLE = {name: i for i, name in enumerate(ROLES)}
# meta "dispatch": how the kernel moved dispatched rows (gpu/kernels/processor.cuh dispatch_chunks):
# "staged" (the kernel's default, sim.costs.DEFAULT_DISPATCH) stores this GPU's own
# chunks from most processors while a few send the peers' chunks local expert by local expert,
# "store" shares every chunk among the processors at once, "put" packs each chunk and puts it from
# one block (the path where a peer is not reachable)
DISPATCH_PATHS = ("staged", "store", "put")
KIND = {name: i for i, name in enumerate(KINDS)}

# The meta's schema. Both producers (sim.engine, the simulator; gpu.worker, the kernel's telemetry)
# write every key of META_KEYS; readers call check_meta; Trace.load reads older files through
# upgrade_meta, the one place that knows what they lacked.
META_VERSION = 1
SOURCES = ("sim", "gpu")
META_KEYS = {
    "meta_version": "META_VERSION",
    "source": "who produced the trace: 'sim' (the simulator) or 'gpu' (the kernel's telemetry)",
    "config": "the layer's reference.Config, as Config.to_dict()",
    "processors": "processor blocks a GPU",
    "dispatch": "how dispatched rows moved (DISPATCH_PATHS)",
    "staged_blocks": "processors that sent the peers' chunks on the staged dispatch",
    "queue": "when a tile's GEMM tasks were queued (sim.costs.QUEUE_POLICIES)",
}


class TraceError(ValueError):
    """A trace file or table that does not follow the schema."""


def upgrade_meta(meta: dict) -> dict:
    """`meta` as META_VERSION. Version 0 (no "meta_version" key): simulated traces said "producer",
    measured ones "n_proc" for the processors; measured traces from before the kernel recorded them
    lack "dispatch" (it put every tile), "staged_blocks" (32 sent the peers' chunks), "queue" (each
    tile's tasks as it landed) and the config's "merge_sources" (each source's rows in tiles of
    their own)."""
    version = meta.get("meta_version", 0)
    if version == META_VERSION:
        return dict(meta)
    if version != 0:
        raise TraceError(f"trace meta_version {version!r} is not one this moelab reads (0 or {META_VERSION})")
    m = dict(meta)
    if "producer" in m:
        m.setdefault("source", m.pop("producer"))
    if "n_proc" in m:
        m["processors"] = m.pop("n_proc")
    if m.get("source") == "gpu":
        m = {"dispatch": "put", "staged_blocks": 32, "queue": "tile", **m}
        if isinstance(m.get("config"), dict):
            m["config"] = {"merge_sources": False, **m["config"]}
    return {**m, "meta_version": META_VERSION}


def check_meta(meta: dict) -> None:
    """Raise TraceError naming the first key of META_KEYS that `meta` lacks or holds wrongly."""
    for key, what in META_KEYS.items():
        if key not in meta:
            raise TraceError(f"trace meta has no {key!r} ({what}): a trace of meta version {META_VERSION} "
                             f"has {', '.join(META_KEYS)}")
    allowed = {"meta_version": (META_VERSION,), "source": SOURCES, "dispatch": DISPATCH_PATHS}
    for key, values in allowed.items():
        if meta[key] not in values:
            raise TraceError(f"trace meta {key!r} = {meta[key]!r} is not allowed: one of {list(values)}")
    for key in ("processors", "staged_blocks"):
        if not isinstance(meta[key], int) or isinstance(meta[key], bool) or meta[key] < 0:
            raise TraceError(f"trace meta {key!r} = {meta[key]!r} is not allowed: a count (int >= 0)")
    if not isinstance(meta["config"], dict):
        raise TraceError(f"trace meta 'config' = {meta['config']!r} is not allowed: a dict of Config fields")


@dataclass(eq=False)
class Trace:
    """Columns of equal length (see COLUMNS) and a JSON-able `meta` dict."""

    columns: dict[str, np.ndarray]
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        missing = [c for c in COLUMNS if c not in self.columns]
        if missing:
            raise TraceError(f"trace column(s) {missing} missing: a trace has {list(COLUMNS)}")
        n = {len(v) for v in self.columns.values()}
        if len(n) > 1:
            raise TraceError(f"trace columns have different lengths {sorted(n)}")
        try:
            self.columns = {c: np.asarray(self.columns[c], dt) for c, dt in COLUMNS.items()}
        except (TypeError, ValueError) as e:
            raise TraceError(f"trace columns are not numbers of the schema's types ({e})") from e

    def __len__(self) -> int:
        return len(self.columns["start"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def select(self, mask: np.ndarray) -> Trace:
        return Trace({c: v[mask] for c, v in self.columns.items()}, dict(self.meta))

    def where(self, role: str | None = None, kind: str | None = None) -> Trace:
        mask = np.ones(len(self), bool)
        if role is not None:
            mask &= self["role"] == ROLE[role]
        if kind is not None:
            mask &= self["kind"] == KIND[kind]
        return self.select(mask)

    def sorted(self) -> Trace:
        """Rows in (rank, role, lane, start) order: a canonical order for comparisons."""
        order = np.lexsort((self["end"], self["start"], *self._group()))
        return Trace({c: np.take(v, order) for c, v in self.columns.items()}, dict(self.meta))

    def _group(self) -> tuple[np.ndarray, ...]:
        """Sort keys, last major, ordering rows as their (rank, role, lane): one int64 where the three
        ranges fit in it (fewer keys for the sort to pass over), else the three."""
        keys = [self[c].astype(np.int64) for c in ("lane", "role", "rank")]
        if not len(keys[0]):
            return tuple(keys)
        lo = [int(k.min()) for k in keys]
        span = [int(k.max()) - m + 1 for k, m in zip(keys, lo)]
        if span[0] * span[1] * span[2] >= 1 << 62:
            return tuple(keys)
        lane, role, rank = (k - m for k, m in zip(keys, lo))
        return ((rank * span[1] + role) * span[0] + lane,)

    def save(self, path: str | Path) -> None:
        """`.npz` columns, or Perfetto JSON when the path ends in `.json` (a meta number that is not
        finite written as null)."""
        path = Path(path)
        if path.suffix == ".json":
            path.write_text(json_text(self.to_perfetto()))
        else:
            np.savez_compressed(path, meta=json_text(self.meta, sort_keys=True), **self.columns)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """A trace `.npz` (the schema's columns and a JSON `meta`); any failure is one TraceError line."""
        expected = "a trace .npz with columns " + ", ".join(COLUMNS) + " and a JSON 'meta'"
        try:
            data = load_npz(path, expected, tuple(COLUMNS))
            meta = json_of_array(path, data, "meta", expected) if "meta" in data else {}
            for c in ("start", "end"):
                finite(path, c, data[c], expected)
            if data["start"].ndim != 1:
                raise FileError(path, f"holds 'start' of shape {data['start'].shape}", expected + " (1-D)")
            return cls({c: data[c] for c in COLUMNS}, upgrade_meta(meta))
        except FileError as e:
            raise TraceError(str(e)) from e
        except TraceError as e:
            raise TraceError(f"file {str(path)!r}: {e}") from e

    def to_perfetto(self) -> dict:
        """Chrome trace-event JSON: one process per rank, one thread per (role, lane)."""
        events = []
        tids: dict[tuple[int, int, int], int] = {}
        for i in range(len(self)):
            rank, role, lane = int(self["rank"][i]), int(self["role"][i]), int(self["lane"][i])
            key = (rank, role, lane)
            if key not in tids:
                tids[key] = role * 100_000 + lane
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tids[key],
                               "args": {"name": f"{ROLES[role]} {lane}"}})
            args = {c: int(self[c][i]) for c in ("expert", "tile", "peer", "bytes") if self[c][i] >= 0}
            events.append({"ph": "X", "name": KINDS[self["kind"][i]], "cat": ROLES[role],
                           "pid": rank, "tid": tids[key], "ts": float(self["start"][i]) / 1e3,
                           "dur": float(self["end"][i] - self["start"][i]) / 1e3, "args": args})
        for rank in sorted({k[0] for k in tids}):
            events.append({"ph": "M", "name": "process_name", "pid": rank,
                           "args": {"name": f"GPU {rank}"}})
        return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": self.meta}


class KeyedRows:
    """Rows on one GPU's lanes of one role whose kind, expert and tile follow from an id (a task's,
    through the arrays given): each appended as (lane, start, end, id) to one array of floats, no
    Python object a row (a simulation appends millions); the other columns are made at build, with
    peer -1 and no bytes."""

    def __init__(self, rank: int, node: int, role: str, kind_of: np.ndarray, tile_of: np.ndarray,
                 expert_of_tile: np.ndarray):
        self.rank, self.node, self.role = rank, node, ROLE[role]
        self.kind_of, self.tile_of, self.expert_of_tile = kind_of, tile_of, expert_of_tile
        self._values = array("d")  # lane, start, end, id of each row (ints exact in a double below 2^53)
        self.add = self._values.extend  # add((lane, start, end, id))

    def columns(self) -> dict[str, np.ndarray]:
        """The rows as the trace's columns (COLUMNS' types)."""
        v = np.frombuffer(self._values, np.float64).reshape(-1, 4)
        ids = v[:, 3].astype(np.int64)
        tile = self.tile_of[ids]
        n = len(ids)
        made = {"rank": np.full(n, self.rank), "node": np.full(n, self.node), "lane": v[:, 0],
                "role": np.full(n, self.role), "kind": self.kind_of[ids], "start": v[:, 1], "end": v[:, 2],
                "expert": self.expert_of_tile[tile], "tile": tile, "peer": np.full(n, -1), "bytes": np.zeros(n)}
        return {c: made[c].astype(dt) for c, dt in COLUMNS.items()}


class TraceBuilder:
    """Appends rows one at a time (as a simulation or a log decoder produces them), packed into
    columns every `CHUNK` rows: a row held as a Python tuple costs about four times its columns;
    a simulation's task rows go to `KeyedRows` (keyed), the trace's rows after the others."""

    CHUNK = 1 << 16
    _DTYPE = np.dtype(list(COLUMNS.items()))

    def __init__(self):
        self._rows: list[tuple] = []
        self._packed: list[np.ndarray] = []
        self._keyed: list[KeyedRows] = []
        # add_row without its check, for a simulation's hottest handlers: whoever appends so calls
        # pack_full() now and then (the engine does, every few thousand events)
        self.append = self._rows.append

    def keyed(self, rank: int, node: int, role: str, kind_of: np.ndarray, tile_of: np.ndarray,
              expert_of_tile: np.ndarray) -> KeyedRows:
        """A new log of keyed rows (KeyedRows), part of this trace."""
        log = KeyedRows(rank, node, role, kind_of, tile_of, expert_of_tile)
        self._keyed.append(log)
        return log

    def add(self, rank: int, node: int, lane: int, role: str, kind: str, start: float, end: float,
            expert: int = -1, tile: int = -1, peer: int = -1, nbytes: int = 0) -> None:
        self.add_row((rank, node, lane, ROLE[role], KIND[kind], start, end, expert, tile, peer, nbytes))

    def add_row(self, row: tuple) -> None:
        """A row as `add` makes it: role and kind by their codes (ROLE, KIND), every column given."""
        self._rows.append(row)
        self.pack_full()

    def pack_full(self) -> None:
        """Pack the rows appended since the last pack if they are `CHUNK` or more."""
        if len(self._rows) >= self.CHUNK:
            self._pack()

    def _pack(self) -> None:
        if self._rows:
            self._packed.append(np.array(self._rows, self._DTYPE))
            self._rows.clear()  # the same list: `append` stays bound to it

    def build(self, meta: dict | None = None) -> Trace:
        """The trace of every row added; the rows move into it (the builder is empty again), each
        column contiguous (a field of the packed rows is a strided view: slow to sort and gather)."""
        self._pack()
        packed, self._packed = self._packed, []
        keyed, self._keyed = [log.columns() for log in self._keyed], []
        return Trace({c: np.concatenate([p[c] for p in packed] + [k[c] for k in keyed])
                      if packed or keyed else np.empty(0, dt) for c, dt in COLUMNS.items()}, meta or {})


def concat(traces: list[Trace], meta: dict | None = None) -> Trace:
    cols = {c: np.concatenate([t[c] for t in traces]) if traces else np.empty(0, dt)
            for c, dt in COLUMNS.items()}
    return Trace(cols, meta if meta is not None else (dict(traces[0].meta) if traces else {}))
