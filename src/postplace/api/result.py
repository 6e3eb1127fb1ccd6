"""What :func:`postplace.place` returns: :class:`PlaceResult` (the placement, which candidate it is,
every figure behind the choice) and :class:`Candidate` (one placement considered).
"""

from __future__ import annotations

import json
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
        return (f"PlaceResult({self.summary['graph']!r} on {self.summary['cluster']!r}: {self.returned}, "
                f"{_ms(self.step_time_s)} {self.summary['figures']['best_step_time_s']})")  # fmt: skip

    def __str__(self) -> str:
        s = self.summary
        kind = s["figures"]["best_step_time_s"]
        lines = [f"{s['graph']} on {s['cluster']}: {s['strategy']}, {s['samples']} samples ({kind})",
                 f"  returned ({self.returned}): {_ms(self.step_time_s)}"]  # fmt: skip
        lines.append(f"  search best: {_ms(s['search_best_step_time_s'])}")
        start = s.get("search_start")
        if isinstance(start, dict) and start.get("name") is not None:
            lines.append(f"  search start: {start['name']}, {_ms(start.get('step_time_s'))}")
        for c in self.candidates:
            if c.name != "search":
                lines.append(f"  {c.name}: {_ms(c.step_time_s)}" + (f"  ({c.note})" if c.note else ""))
        lines.append(f"  lower bound: {_ms(self.lower_bound_s)} (simulated)")
        return "\n".join(lines)


def _ms(x) -> str:
    if x is None:
        return "-"
    return "inf" if not np.isfinite(x) else f"{x * 1e3:.3f} ms"
