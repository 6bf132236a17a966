"""The package's version, in a module of its own: `--version` and the package read it without importing the
rest of trainmem."""

__version__ = "0.1.0"
