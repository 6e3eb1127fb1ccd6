"""What :func:`postplace.place` returns: :class:`PlaceResult` (the placement, which candidate it is,
every figure behind the choice) and :class:`Candidate` (one placement considered).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from postplace.validate import make_folder


@dataclass
class Candidate:
    """One placement ``place`` considered: its name, op-level devices, and what the evaluator said."""

    name: str
    placement: np.ndarray | None
    step_time_s: float | None
    feasible: bool
    note: str = ""
    graph: object | None = None
    """The step ``placement`` places when it is not the run's own: a practitioner plan's rewritten step."""
    plan: str | None = None
    """The practitioner plan (``fsdp+recompute:m=8,dp=8``) that made ``graph``, which ``simulate --plan`` times."""


@dataclass
class PlaceResult:
    """What :func:`place` returns: the placement, where it came from, and every figure behind the choice.

    :func:`place` and :func:`resume` build it; its fields are read, not passed.

    Parameters
    ----------
    graph : postplace.graph.OpGraph
        The graph that was placed (for a zoo model or a module: its traced step).
    cluster : postplace.cluster.Cluster
        The cluster it was placed on.
    placement : numpy.ndarray
        int64 device id per op of ``graph`` (the returned placement).
    returned : str
        Where it came from: ``"search"``, ``"warm-start:NAME"``, or a placer (``"single:gpu0"``, ``"m-etf"``...).
    step_time_s : float
        Its step time by ``evaluator`` (``"simulator"``: simulated; ``"torch"``: measured).
    evaluator : str
        The name of the evaluator behind ``step_time_s``: ``"simulator"`` or ``"torch"``.
    search : postplace.search.SearchResult
        The search's own result (its best over its units, samples, curve).
    search_placement : numpy.ndarray or None
        The search's own best, expanded to one device per op (None when it sampled nothing feasible).
    candidates : list of Candidate
        Every candidate with its step time (None where it failed or ran out of memory) and a note.
    lower_bound_s : float
        The simulator's lower bound (always simulated).
    schedule : postplace.sim.trace.Schedule
        The simulated schedule of the returned placement (``schedule.save_chrome_trace(path)``).
    summary : dict
        Every figure as JSON-able data (what ``summary.json`` holds).
    traced : object or None
        The traced step (:func:`postplace.graph.trace_torch.trace`) when the target was an ``nn.Module``:
        what :func:`apply` runs. None otherwise.
    target_spec : dict
        How the target was loaded, as ``run.json`` records it (``{"kind": "zoo", "name": ...}``).
    report : pathlib.Path or None
        The run folder's ``report.html``, when one was written.

    Attributes
    ----------
    search_best_step_time_s : float or None
        The search's own best, whatever was returned (None when it sampled nothing feasible).
    """

    graph: object
    cluster: object
    placement: np.ndarray
    returned: str
    step_time_s: float
    evaluator: str
    search: object
    search_placement: np.ndarray | None
    candidates: list[Candidate]
    lower_bound_s: float
    schedule: object
    summary: dict
    traced: object | None = None
    target_spec: dict = field(default_factory=dict)
    report: Path | None = None

    @property
    def search_best_step_time_s(self) -> float | None:
        """The search's own best step time, whatever was returned (None when it sampled nothing feasible)."""
        return self.summary["search_best_step_time_s"]

    def mapping(self) -> dict[str, str]:
        """``{op name: device name}`` of the returned placement.

        Returns
        -------
        dict of str to str
            Each op's name and the name of the device it runs on.
        """
        from postplace.cluster.placement import to_mapping

        return to_mapping(self.graph, self.cluster, self.placement)

    def to_json(self) -> str:
        """The summary as indented JSON (what ``summary.json`` holds).

        Returns
        -------
        str
        """
        return json.dumps(self.summary, indent=1)

    def save(self, folder: str | Path) -> Path:
        """Write ``placement.json`` and ``summary.json`` into ``folder``; returns the folder.

        Parameters
        ----------
        folder : str or path
            Created when missing.

        Returns
        -------
        pathlib.Path
            The folder.

        Raises
        ------
        PostplaceError
            When ``folder`` cannot be created (a file stands there, no permission).
        """
        from postplace.cluster.placement import save_placement

        folder = make_folder(folder, "save folder")
        save_placement(folder / "placement.json", self.graph, self.cluster, self.placement)
        tmp = folder / "summary.json.tmp"
        tmp.write_text(self.to_json())
        tmp.replace(folder / "summary.json")
        return folder

    def __repr__(self) -> str:
        return (
            f"PlaceResult({self.summary['graph']!r} on {self.summary['cluster']!r}: {self.returned}, "
            f"{_ms(self.step_time_s)} {self.summary['figures']['best_step_time_s']})"
        )

    def __str__(self) -> str:
        s = self.summary
        kind = s["figures"]["best_step_time_s"]
        lines = [
            f"{s['graph']} on {s['cluster']}: {s['strategy']}, {s['samples']} samples ({kind})",
            f"  returned ({self.returned}): {_ms(self.step_time_s)}",
        ]
        lines.append(f"  search best: {_ms(s['search_best_step_time_s'])}")
        start = s.get("search_start")
        if isinstance(start, dict) and start.get("name") is not None:
            lines.append(f"  search start: {start['name']}, {_ms(start.get('step_time_s'))}")
        plans = s.get("plan_search")
        if plans and plans.get("best_step_time_s") is not None:
            lines.append(
                f"  plan search (Post over per-unit plans, simulated): {_ms(plans['best_step_time_s'])} from "
                f"{plans['start']}, {_ms(plans['start_step_time_s'])}"
            )
        for c in self.candidates:
            if c.name != "search":
                lines.append(f"  {c.name}: {_ms(c.step_time_s)}" + (f"  ({c.note})" if c.note else ""))
        lines.append(f"  lower bound: {_ms(self.lower_bound_s)} (simulated)")
        return "\n".join(lines)


def _ms(x) -> str:
    if x is None:
        return "-"
    return "inf" if not np.isfinite(x) else f"{x * 1e3:.3f} ms"


@dataclass(eq=False)
class CompareResult(Mapping):
    """What :func:`compare` returns: every row of the comparison, with the figures they are measured against.

    Its fields are what ``compare.json`` holds, plus ``out``; each is an attribute (``result.rows``,
    ``result.lower_bound_s``). Read as a mapping too (``result["rows"]``, ``result.get("cost_model")``,
    ``result.keys()``), as the plain dict :func:`compare` returned before, for callers written then.

    Parameters
    ----------
    graph, cluster : str
        The names of the graph compared and of the cluster.
    budget_samples : int
        Samples of each search run.
    seeds : int
        Search runs per strategy.
    evaluator : str
        What priced every row (``"simulator"``).
    lower_bound_s : float
        The simulator's lower bound of the step; ``ratio_to_lower_bound`` of each row is over it.
    single_device_step_time_s : float or None
        The best single device's step time (None: no device holds the step alone).
    rows : list of dict
        One per strategy, in the order asked: ``strategy``, ``kind``, ``best_step_time_s`` (a search's
        median over seeds), ``min_step_time_s``, ``max_step_time_s``, ratios, ``mfu``, ``note``...
    out : pathlib.Path
        The folder written (``compare.json``, ``compare.csv``, each search run's folder).
    cost_model, groups, target_spec, cluster_spec, cluster_sha, microbatches
        How the step was priced, grouped and loaded, as ``compare.json`` records them.
    extra : dict
        Any other key of ``compare.json`` (from a newer comparison), kept for :meth:`to_dict`.
    """

    graph: str
    cluster: str
    budget_samples: int
    seeds: int
    evaluator: str
    lower_bound_s: float
    single_device_step_time_s: float | None
    rows: list[dict]
    out: Path
    cost_model: str | None = None
    groups: int | None = None
    target_spec: dict | None = None
    cluster_spec: str | None = None
    cluster_sha: str | None = None
    microbatches: int = 1
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_report(cls, report: dict, out) -> CompareResult:
        """The result of the report dict :func:`postplace.comparison.compare` wrote to ``out/compare.json``.

        Parameters
        ----------
        report : dict
            The comparison's report.
        out : str or path
            Its folder.

        Returns
        -------
        CompareResult
        """
        names = {f for f in cls.__dataclass_fields__ if f not in ("out", "extra")}
        return cls(
            **{k: v for k, v in report.items() if k in names},
            out=Path(out),
            extra={k: v for k, v in report.items() if k not in names and k != "out"},
        )

    def row(self, strategy: str) -> dict:
        """The row of ``strategy``.

        Parameters
        ----------
        strategy : str
            A name the comparison ran (``"post"``, ``"metis"``, ``"data-parallel"``...).

        Returns
        -------
        dict

        Raises
        ------
        KeyError
            When the comparison has no such row.
        """
        for r in self.rows:
            if r["strategy"] == strategy:
                return r
        raise KeyError(f"no row '{strategy}'; the rows are {', '.join(r['strategy'] for r in self.rows)}")

    def to_dict(self) -> dict:
        """The report as JSON-able data: ``compare.json``'s keys, and ``out`` as text.

        Returns
        -------
        dict
        """
        d = {f: getattr(self, f) for f in self.__dataclass_fields__ if f not in ("out", "extra")}
        return {**d, **self.extra, "out": str(self.out)}

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON.

        Returns
        -------
        str
        """
        return json.dumps(self.to_dict(), indent=1)

    # the mapping the plain dict gave callers written before (result["rows"], result.get(...), dict(result)):
    # Mapping's keys, items, values, get and `in` come from these three
    def __getitem__(self, key: str):
        return self.to_dict()[key]

    def __iter__(self):
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def __str__(self) -> str:
        lines = [
            f"{self.graph} on {self.cluster}: {len(self.rows)} strategies, {self.budget_samples} samples x "
            f"{self.seeds} seed{'' if self.seeds == 1 else 's'} ({self.evaluator})"
        ]
        for r in self.rows:
            lines.append(
                f"  {r['strategy']}: {_ms(r.get('best_step_time_s'))}" + (f"  ({r['note']})" if r.get("note") else "")
            )
        lines.append(f"  lower bound: {_ms(self.lower_bound_s)} (simulated)")
        return "\n".join(lines)
