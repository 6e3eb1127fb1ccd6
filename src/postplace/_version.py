"""The package's version, in a module of its own so that any box may read it (the report's provenance)
without importing the package's front door."""

__version__ = "0.1.0"
