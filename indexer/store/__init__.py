"""The only package that talks to Qdrant: an embedded Qdrant Edge store, or a Qdrant server through qdrant-client.

``Store`` (``base.py``) is the interface and holds the one translation of filters and queries; ``EdgeStore``
(``edge.py``) and ``ServerStore`` (``server.py``) are thin dialect adapters. The schema of points and payloads is
``indexer.points``'.
"""

from __future__ import annotations

from pathlib import Path

from indexer.store.base import Store
from indexer.store.edge import EdgeStore
from indexer.store.layout import ServerOptions
from indexer.store.server import ServerStore

__all__ = ["EdgeStore", "ServerOptions", "ServerStore", "Store", "open_store"]


def open_store(edge_root: Path, qdrant_url: str = "", api_key: str = "", options: ServerOptions | None = None,
               min_free_bytes: int = 0) -> Store:
    """The configured backend: Edge in the folder ``edge_root`` (the daemon's: ``statedir.edge_store``) when
    ``qdrant_url`` is empty (writes refused while
    fewer than ``min_free_bytes`` bytes would stay free there; of ``options``, its on-disk vectors and quantization),
    qdrant-client's in-process mode for ``":memory:"``, else the server at ``qdrant_url`` (``options``: timeouts,
    request limits, collection creation settings)."""
    if not qdrant_url:
        o = options or ServerOptions()
        return EdgeStore(edge_root, min_free_bytes, o.on_disk_vectors, o.quantization)
    return ServerStore(qdrant_url, api_key, options)
