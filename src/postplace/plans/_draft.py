"""An editable copy of an OpGraph, for the plan passes: ops copied or made, edges added, then frozen.

The passes of this package rewrite whole steps (k replicas, collectives, recomputed layers), which is
awkward on the immutable arrays of :class:`~postplace.graph.OpGraph`. A :class:`Draft` holds plain
lists instead. Every op carries a *key*, a tuple that orders it; :meth:`Draft.freeze` stores the ops
in the topological order that follows the keys wherever the edges allow (Kahn's algorithm over a heap
of keys), so a pass says "right after this op" or "just before that one" by its key alone and the
frozen graph's program order (the simulator's priority) follows.
"""

from __future__ import annotations

import heapq

import numpy as np

from postplace.graph import Collective, Measurement, OpGraph

_COPIED = (
    "op_types",
    "flops",
    "bytes_accessed",
    "output_bytes",
    "persistent_bytes",
    "colocation",
    "phase",
    "allowed_kinds",
    "inplace",
    "microbatch",
    "module",
    "precision",
)


class Draft:
    """Ops and edges under construction, derived from ``source``.

    Parameters
    ----------
    source : OpGraph
        The graph whose ops :meth:`copy` copies; its measurements follow the copies (scaled with
        their cost), made ops are unmeasured.
    """

    def __init__(self, source: OpGraph):
        self.source = source
        # the source's fields as Python lists, built once: indexing numpy arrays per copied op was most of
        # a pass's time on a large step
        self._source_fields = {
            f: list(getattr(source, f)) if isinstance(getattr(source, f), tuple) else getattr(source, f).tolist()
            for f in _COPIED
        }
        self.names: list[str] = []
        self.fields: dict[str, list] = {f: [] for f in _COPIED}
        self.inplace_base: list[int] = []
        self.collective: list[int] = []
        self.key: list[tuple] = []
        self.origin: list[int] = []  # the source op copied, -1 for a made op
        self.scale: list[float] = []  # its measured time is the source's times this
        self.tag: list[int] = []  # the pass's own label (the replica)
        self.edges: dict[tuple[int, int, int], float] = {}
        self._max_slot: dict[int, int] = {}
        self._control: dict[int, int] = {}
        self.collectives: list[Collective] = []

    def __len__(self) -> int:
        return len(self.names)

    def copy(self, i: int, name: str, key: tuple, tag: int = 0, *, scale: float = 1.0, **changes) -> int:
        """Copy source op ``i`` as ``name``; ``scale`` multiplies its FLOPs, bytes and measured time."""
        values = {f: v[i] for f, v in self._source_fields.items()}
        values["flops"] *= scale
        values["bytes_accessed"] *= scale
        values["output_bytes"] *= scale
        values.update(changes)
        return self._add(name, values, key, tag, origin=i, scale=scale, base=changes.pop("inplace_base", -1))

    def make(
        self,
        name: str,
        key: tuple,
        tag: int = 0,
        *,
        phase: int,
        microbatch: int = -1,
        module: str = "",
        op_type: str = "op",
        output_bytes: float = 0.0,
        inplace: bool = False,
        collective: int = -1,
        allowed_kinds: int = 3,
    ) -> int:
        """A new op of no cost (a collective's member, say)."""
        values = dict(
            op_types=op_type,
            flops=0.0,
            bytes_accessed=0.0,
            output_bytes=output_bytes,
            persistent_bytes=0.0,
            colocation=-1,
            phase=phase,
            allowed_kinds=allowed_kinds,
            inplace=inplace,
            microbatch=microbatch,
            module=module,
            precision=0,
        )
        return self._add(name, values, key, tag, origin=-1, scale=0.0, base=-1, collective=collective)

    def _add(self, name, values, key, tag, *, origin, scale, base, collective=-1) -> int:
        values.pop("inplace_base", None)
        for f in _COPIED:
            self.fields[f].append(values[f])
        self.names.append(name)
        self.inplace_base.append(base)
        self.collective.append(collective)
        self.key.append(key)
        self.origin.append(origin)
        self.scale.append(scale)
        self.tag.append(tag)
        return len(self.names) - 1

    def set(self, i: int, field: str, value) -> None:
        """Change one field of op ``i``."""
        if field == "inplace_base":
            self.inplace_base[i] = value
        else:
            self.fields[field][i] = value

    def edge(self, src: int, dst: int, slot: int, nbytes: float) -> None:
        """An edge carrying output ``slot`` of ``src`` (``nbytes``) to ``dst``."""
        self.edges[(src, dst, slot)] = float(nbytes)
        if slot > self._max_slot.get(src, -1):
            self._max_slot[src] = slot

    def add_collective(self, kind: str, nbytes: float, name: str) -> int:
        """A new collective; its members are the ops made with ``collective=`` its id."""
        self.collectives.append(Collective(kind, float(nbytes), name))
        return len(self.collectives) - 1

    def order(self, src: int, dst: int) -> None:
        """``dst`` waits for ``src``: a zero-byte edge on an output slot of ``src`` no data edge uses
        (add data edges first)."""
        if src not in self._control:
            self._control[src] = self._max_slot.get(src, -1) + 1
        self.edges[(src, dst, self._control[src])] = 0.0

    def freeze(self, name: str, metadata: dict) -> tuple[OpGraph, np.ndarray]:
        """The OpGraph, and each of its ops' tag (in the frozen order)."""
        n = len(self.names)
        succ: list[list[int]] = [[] for _ in range(n)]
        indeg = [0] * n
        for s, d, _ in self.edges:
            succ[s].append(d)
            indeg[d] += 1
        heap = [(self.key[i], i) for i in range(n) if indeg[i] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            _, i = heapq.heappop(heap)
            order.append(i)
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    heapq.heappush(heap, (self.key[j], j))
        if len(order) != n:
            raise AssertionError("a plan pass made a cycle")  # a bug of the pass, never the user's input
        new = np.empty(n, dtype=np.int64)
        new[order] = np.arange(n)
        pick = np.asarray(order, dtype=np.int64)
        f = {k: [v[i] for i in order] for k, v in self.fields.items()}
        base = [int(new[self.inplace_base[i]]) if self.inplace_base[i] >= 0 else -1 for i in order]
        origin = np.asarray(self.origin, dtype=np.int64)[pick]
        scale = np.asarray(self.scale)[pick]
        measured = []
        for m in self.source.measured:
            times = np.where(origin >= 0, m.times[np.maximum(origin, 0)] * scale, np.nan)
            measured.append(Measurement(m.key, m.kind, times, m.provenance))
        edges = list(self.edges.items())
        graph = OpGraph(
            names=tuple(self.names[i] for i in order),
            op_types=tuple(f["op_types"]),
            flops=f["flops"],
            bytes_accessed=f["bytes_accessed"],
            output_bytes=f["output_bytes"],
            persistent_bytes=f["persistent_bytes"],
            colocation=f["colocation"],
            phase=f["phase"],
            allowed_kinds=f["allowed_kinds"],
            inplace=f["inplace"],
            inplace_base=base,
            edge_src=[int(new[s]) for (s, _, _), _ in edges],
            edge_dst=[int(new[d]) for (_, d, _), _ in edges],
            edge_slot=[slot for (_, _, slot), _ in edges],
            edge_bytes=[b for _, b in edges],
            memory_mode=self.source.memory_mode,
            measured=tuple(measured),
            name=name,
            metadata=metadata,
            microbatch=f["microbatch"],
            module=tuple(f["module"]),
            precision=f["precision"],
            collective=[self.collective[i] for i in order],
            collectives=tuple(self.collectives),
        )
        return graph, np.asarray(self.tag, dtype=np.int64)[pick]
