#!/usr/bin/env bash
# Install the infinity-emb embedding/rerank server the endpoint tests and benchmarks start, into its own
# virtualenv, and print the path of its `infinity_emb` command.
#
# infinity-emb pins an older sentence-transformers (<4) and numpy (<2) than qmd-indexer's, so it lives in a
# virtualenv of its own, as a user runs a separate server: default `.infinity/venv` in the repository (git-ignored),
# override with $QMD_INFINITY_VENV. The CPU build of torch goes in first (anything else pulls a multi-GB CUDA build),
# then infinity-emb with its `server` and `torch` extras, pinned to versions known to install and serve offline
# (HF_HUB_OFFLINE=1, models from local paths). Idempotent: a working install is not installed again.
# Exit status 1, with a line on stderr, when the install fails or the server cannot be imported.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${QMD_INFINITY_VENV:-${ROOT}/.infinity/venv}"
PYTHON="${PYTHON:-python3}"
PINS=("infinity-emb[server,torch]==0.0.78" "sentence-transformers==3.4.1" "transformers==4.57.6")

works() { [ -x "${VENV}/bin/infinity_emb" ] && "${VENV}/bin/python" -c "import infinity_emb, sentence_transformers" 2>/dev/null \
          && [ "$("${VENV}/bin/python" -c 'import importlib.metadata as m; print(m.version("infinity-emb"))')" = "0.0.78" ]; }

if ! works; then
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
  "${VENV}/bin/pip" install -q --upgrade pip >&2
  "${VENV}/bin/pip" install -q torch==2.13.0 >&2
  "${VENV}/bin/pip" install -q "${PINS[@]}" >&2
  if ! works; then
    echo "install.sh: infinity-emb does not import from ${VENV} after installing ${PINS[*]}" >&2
    exit 1
  fi
fi
echo "${VENV}/bin/infinity_emb"
