"""Real Qdrant servers for the tests: one single node and one 3-node cluster on free loopback ports.

The processes are ``tests/qdrant/nodes.py``'s (no pytest there, so benchmarks start them too). Without the binary,
every test that asks for a server skips and says how to get it (``make qdrant``; ``.ci/run`` installs it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from qdrant import nodes
from qdrant.nodes import (  # noqa: F401  (re-exported for the tests)
    BINARY,
    CLUSTER_COLLECTIONS,
    READY_TIMEOUT_S,
    Cluster,
    Node,
    drop_all_collections,
    free_port,
    make_cluster,
    make_node,
)


def need_binary() -> Path:
    """The Qdrant binary, or skip the calling test with the reason."""
    reason = nodes.missing()
    if reason:
        pytest.skip(reason)
    return BINARY


@contextlib.contextmanager
def running(thing: Node | Cluster) -> Iterator[Node | Cluster]:
    """Start ``thing`` (skipping the test when the binary is missing); stop it on exit, also on failure."""
    need_binary()
    with nodes.running(thing) as started:
        yield started


@pytest.fixture(scope="session")
def qdrant_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """One single-node Qdrant server for the whole session; tests clean up their collections."""
    need_binary()
    with running(make_node(tmp_path_factory.mktemp("qdrant-node"))) as node:
        yield node


@pytest.fixture(scope="session")
def qdrant_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One 3-node Qdrant cluster for the whole session (tests that kill nodes start their own)."""
    need_binary()
    with running(make_cluster(tmp_path_factory.mktemp("qdrant-cluster"))) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def fault_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A 3-node cluster of the test module's own, for tests that kill and restart nodes."""
    need_binary()
    with running(make_cluster(tmp_path_factory.mktemp("qdrant-fault"))) as cluster:
        yield cluster
