"""``python -m indexer``: the ``qmd-indexer`` command line."""

from indexer.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
