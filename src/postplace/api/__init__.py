"""The library's front door: :func:`place`, :func:`resume`, :func:`compare`, :func:`apply`, :class:`PlaceResult`.

Everything the ``postplace place`` and ``compare`` commands decide lives in this package (the CLI only
parses, calls and prints), one file per decision:

* :mod:`~postplace.api.target`: what is placed (model, file, graph or module, with its optimizer,
  precision and micro-batch count) and on which cluster;
* :mod:`~postplace.api.settings`: the run's settings (``run.json``), built, written and checked;
* :mod:`~postplace.api.run`: the one answer path: the search at every micro-batch count (one count the
  special case), the candidates at each, then the choice;
* :mod:`~postplace.api.over_m`: which counts, and the budget's successive halving over them;
* :mod:`~postplace.api.candidates`: the candidates (search, warm start, data parallelism, pipeline,
  one-shot placers) and which one is returned;
* :mod:`~postplace.api.measure`: measured evaluation (``--evaluator torch``, ``--ray``, ``--confirm``);
* :mod:`~postplace.api.summary`: ``summary.json`` and the plan in words;
* :mod:`~postplace.api.folder`: continuing a run folder;
* :mod:`~postplace.api.result`: what ``place`` and ``compare`` return;
* :mod:`~postplace.api.options`: the grouped arguments ``Step`` (the training step) and ``Measure``;
* :mod:`~postplace.api.front`: the four calls themselves.
"""

from postplace.api.candidates import CANDIDATE_PLACERS
from postplace.api.front import apply, compare, place, resume
from postplace.api.layered import LayeredComparison, LayeredPlaceResult, compare_layered, place_layered
from postplace.api.options import Measure, Step
from postplace.api.result import CompareResult, PlaceResult
from postplace.api.target import load_target

__all__ = [
    "CANDIDATE_PLACERS",
    "CompareResult",
    "LayeredComparison",
    "LayeredPlaceResult",
    "Measure",
    "PlaceResult",
    "Step",
    "apply",
    "compare",
    "compare_layered",
    "load_target",
    "place",
    "place_layered",
    "resume",
]
