"""qmd-indexer: keeps an AI agent's memory files indexed in Qdrant and answers semantic searches over them.

Start at ``indexer.daemon`` (the indexing service) or ``indexer.api`` (the plugin contract). Importing this package
imports nothing heavy.
"""

__version__ = "0.1.0"
