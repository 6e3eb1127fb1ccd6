"""Cost models: how long an op takes on a device, and how long a tensor takes between devices."""

from postplace.cost.model import CostModel, OpTimes, RooflineCostModel, priced_on

__all__ = ["CostModel", "OpTimes", "RooflineCostModel", "priced_on"]
