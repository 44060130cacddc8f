"""The package version, a literal in a leaf module: ``diffattn --version``, saved models and adapters read it here
without importing the package root (which would make every saving module depend on everything it re-exports)."""

__version__ = "0.2.0"
