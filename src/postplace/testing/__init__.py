"""Fakes and helpers for tests: hand-sized clusters and cost models with times you choose."""

from postplace.testing.fakes import ConstantCostModel, TableCostModel, star_cluster

__all__ = ["ConstantCostModel", "TableCostModel", "star_cluster"]
