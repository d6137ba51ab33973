"""Lets qmd-indexer's own suite (``make test``) run this plugin's tests without installing it, so the example plugin
never claims ``.txt`` files in the project's other tests. A plugin author installs with ``pip install -e .``."""

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
