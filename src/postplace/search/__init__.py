"""Search: ask/tell strategies over placements, and the runner that drives them."""

from postplace.search.strategy import SearchSpace, Strategy, scores

__all__ = ["SearchSpace", "Strategy", "scores"]
