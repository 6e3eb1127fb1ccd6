"""postplace: fast device placements for deep-learning training (the Post algorithm).

The library is the product; the ``postplace`` command is a thin shell over it:

* :func:`place` searches a placement and returns the best of the search, the best single device
  and the memory-aware one-shot placers (a :class:`PlaceResult`); :func:`resume` continues a run folder;
* :func:`compare` runs every baseline and strategy side by side (a :class:`CompareResult`);
* :func:`place_layered` answers for a zoo transformer at a size the op level cannot hold (LLaMA-70B on 64
  GPUs), the practitioner's grid and a strategy over its per-block choices priced by the layered estimate
  (:func:`compare_layered`: each strategy's own best there);
* :func:`apply` gives a placed training step for the user's own module;
* :class:`Step` (a module's batch, loss and labels, the optimizer, the precision) and :class:`Measure`
  (the torch evaluator, ``confirm``, Ray) group the arguments of ``place`` that travel together.

They are imported on first use, so ``import postplace`` stays fast.
"""

from postplace._version import __version__ as __version__
from postplace.errors import PostplaceError

__all__ = [
    "CompareResult",
    "LayeredComparison",
    "LayeredPlaceResult",
    "Measure",
    "PlaceResult",
    "PostplaceError",
    "Step",
    "apply",
    "compare",
    "compare_layered",
    "load_target",
    "place",
    "place_layered",
    "resume",
]

_API = frozenset(__all__) - {"PostplaceError"}  # the names postplace.api gives, imported on first use


def __getattr__(name):
    if name in _API:
        from postplace import api

        return getattr(api, name)
    raise AttributeError(f"module 'postplace' has no attribute '{name}'")


def __dir__():
    return sorted([*globals(), *_API])
