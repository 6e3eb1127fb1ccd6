"""The names ``postplace.report._data`` held before it was split by job, kept for code that imports
them from here. New code imports them from the module that holds them:

- ``_folder``: reading a run folder (:func:`run_kind`, the JSON files read with input limits, search
  runs' histories and best placements, the run's graph and cluster);
- ``_checks``: the checks of ``summary.json``, ``compare.json`` and ``paper.json`` (:data:`MAX_STEP_S`);
- ``_curves``: the learning curves against samples and wall time;
- ``_schedule``: the returned placement simulated again (Gantt chart, memory);
- ``_map``: the placement map (ops per module, phase and device);
- ``_table``: the step-time table's candidates, the search's start and the lower bound quoted;
- ``_provenance``: graph, cluster, strategy configurations, versions and the report's stamp;
- ``_build``: the report data of a ``place`` or ``compare`` folder, assembled from the above.
"""

from postplace.report._build import build_report_data_for, compare_data, place_data, seeds_of
from postplace.report._checks import (
    MAX_SEEDS,
    MAX_STEP_S,
    STEP_TIMES,
    TOO_LARGE,
    check_compare,
    check_paper,
    check_summary,
    step_time_problem,
)
from postplace.report._curves import MAX_POINTS, NO_FEASIBLE, curve_info
from postplace.report._folder import (
    checked_history,
    checked_units,
    recorded_cluster,
    resolve_cluster_for,
    resolve_graph,
    run_kind,
    run_settings,
)
from postplace.report._map import MAP_MAX_ROWS, map_depth, module_at_depth, op_modules, placement_map_info
from postplace.report._provenance import NOT_RECORDED, REPORT_VERSION, stamp, strategy_configs, versions
from postplace.report._schedule import schedule_info
from postplace.report._table import best_per_candidate, bound_info, candidate_info, candidate_kind, start_info

__all__ = [
    "MAP_MAX_ROWS",
    "MAX_POINTS",
    "MAX_SEEDS",
    "MAX_STEP_S",
    "NOT_RECORDED",
    "NO_FEASIBLE",
    "REPORT_VERSION",
    "STEP_TIMES",
    "TOO_LARGE",
    "best_per_candidate",
    "bound_info",
    "build_report_data_for",
    "candidate_info",
    "candidate_kind",
    "check_compare",
    "check_paper",
    "check_summary",
    "checked_history",
    "checked_units",
    "compare_data",
    "curve_info",
    "map_depth",
    "module_at_depth",
    "op_modules",
    "place_data",
    "placement_map_info",
    "recorded_cluster",
    "resolve_cluster_for",
    "resolve_graph",
    "run_kind",
    "run_settings",
    "schedule_info",
    "seeds_of",
    "stamp",
    "start_info",
    "step_time_problem",
    "strategy_configs",
    "versions",
]
