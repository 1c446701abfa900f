#!/usr/bin/env bash
# Make Fashion-MNIST available: already present -> done; else Debian's dataset-fashion-mnist
# package (when apt-get can be used); else a checksum-verified download into the user cache;
# else a clear error saying how to get it.
set -euo pipefail
PY=${PY:-.venv/bin/python}
if "$PY" -m fedtail.data ensure fmnist --no-download >/dev/null 2>&1; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "fedtail: installing Debian package dataset-fashion-mnist" >&2
  if ! apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || true
  fi
fi
# Falls back to the official download (checksummed); prints where it looked on failure.
"$PY" -m fedtail.data ensure fmnist >/dev/null
