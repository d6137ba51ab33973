"""qmd-indexer: keeps an AI agent's memory files indexed in Qdrant and answers semantic searches over them.

Start at ``indexer.daemon`` (the indexing service) or ``indexer.api`` (the plugin contract). Importing this package
imports nothing heavy. ``__version__`` is the installed distribution's version (``pyproject.toml`` is its one
source), read through ``importlib.metadata``.
"""

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "qmd-indexer"

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
