"""The layout of a Qdrant server, in one place: how to talk to it and what to create (``ServerOptions``, read from
the settings by ``ServerOptions.from_settings``; with the embedders' identity for the daemon by
``rebuild.daemon_options``), and how shared tenancy names its physical collections (``shared_collection``). The
daemon, ``migrate``, ``doctor`` and ``release`` build their options here and hand them to the store (what the state
dir recorded is read by them, through ``indexer.statedir``); ``indexer.store.tenancy`` and ``indexer.store.server``
use them.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024
REBUILD = "--rebuild-"  # physical collections of a rebuild are named <name>--rebuild-<n>

SHARED = "qmd-shared-"  # shared physical collections (tenancy "shared") are named qmd-shared-<kind>-<space digest>
STAGING = "--rebuild"  # beside each: the shared collection a rebuild of its tenants fills, moved in by ``swap``
TENANT_KEY = "collection"  # the tenant key of a shared collection: the payload's logical collection name
PAYLOAD_M = 16  # HNSW links per node of a tenant's graph in a shared collection (Qdrant's default m)
_KIND = re.compile(r"(?:^|-)(?:memory-(root|dir|extra)|(sessions))-")


def shared_collection(name: str, space: str) -> str:
    """The shared physical collection that holds logical collection ``name`` (a rebuild's ``<name>--rebuild-<n>``:
    the staging collection beside it) for embedding space ``space``: ``qmd-shared-<kind>-<12 hex of sha256(space)>``,
    ``kind`` the ``root``, ``dir`` or ``extra`` of ``memory-<kind>-<agent>``, ``sessions`` for ``sessions-<agent>``
    (``other`` for any other name)."""
    logical, _, rebuild = name.partition(REBUILD)
    match = _KIND.search(logical)
    digest = hashlib.sha256(space.encode()).hexdigest()[:12]
    kind = (match.group(1) or match.group(2)) if match else "other"
    return f"{SHARED}{kind}-{digest}{STAGING if rebuild else ''}"


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How to talk to a server and what to create: gRPC on ``grpc_port`` if ``prefer_grpc``; ``timeout_s`` per
    request (seconds); ``max_request_bytes`` the server's request size limit (its ``max_request_size_mb``);
    ``batch_points`` the most points per upsert request; the rest are collection creation settings (``None``: the
    server's default)."""

    prefer_grpc: bool = False
    grpc_port: int = 6334
    timeout_s: float = 10.0
    max_request_bytes: int = 32 * MIB
    batch_points: int = 256
    shard_number: int | None = None
    replication_factor: int | None = None
    write_consistency_factor: int | None = None
    on_disk_vectors: bool = False
    quantization: str = "none"  # "none" or "int8" (scalar)
    tenancy: str = "collections"  # "collections" (one Qdrant collection per logical one), "shared", or "auto"
    # (settled by ``TenantStore.settle`` at the daemon's first connect)
    space: str = ""  # the embedders' identity (``rebuild.model_identity``): names the shared collections
    former_spaces: tuple[str, ...] = ()  # identities the collections were built with before (a model change)

    @classmethod
    def from_settings(cls, settings: Any, recorded_tenancy: str | None = None) -> ServerOptions:
        """The ``qdrant_*`` keys of ``indexer.config.Settings``; tenancy ``"auto"`` is ``recorded_tenancy`` when one
        is handed in (the layout it settled on before for this server: ``statedir.recorded_tenancy``, read by the
        caller; the store reads no state dir)."""
        tenancy = settings.qdrant_tenancy
        if tenancy == "auto" and settings.qdrant_url and recorded_tenancy:
            tenancy = recorded_tenancy
        return cls(prefer_grpc=settings.qdrant_prefer_grpc, grpc_port=settings.qdrant_grpc_port,
                   timeout_s=settings.qdrant_timeout_s,
                   max_request_bytes=int(settings.qdrant_max_request_mb * MIB),
                   batch_points=settings.qdrant_batch_points, shard_number=settings.qdrant_shard_number,
                   replication_factor=settings.qdrant_replication_factor,
                   write_consistency_factor=settings.qdrant_write_consistency_factor,
                   on_disk_vectors=settings.qdrant_on_disk_vectors, quantization=settings.qdrant_quantization,
                   tenancy=tenancy)


@dataclass(frozen=True, slots=True)
class PerTenant:
    """How a shared collection is indexed: ``tenant_index`` whether its tenant key has a keyword index with
    ``is_tenant``; ``m`` and ``payload_m`` its HNSW settings (``m == 0`` and ``payload_m`` set: one graph per
    tenant, none across them; ``None``: not set)."""

    tenant_index: bool
    m: int | None
    payload_m: int | None
