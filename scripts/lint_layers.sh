#!/usr/bin/env bash
# Check the rooms' import layers (pyproject's [tool.importlinter]) with import-linter.
# The package maps its top-level folders (agent/, collectors/, ...) into vllm_sentinel.*; import-linter
# walks a package's folder on disk, so it reads a copy of the sources laid out as the package installs.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/vllm_sentinel"
cp vllm_sentinel/*.py "$tmp/vllm_sentinel/"
find agent collectors reports rules -name '*.py' -not -path '*/recordings/*' \
  -exec cp --parents -t "$tmp/vllm_sentinel" {} +
cd "$tmp"
PYTHONPATH="$tmp" "$repo/.venv/bin/lint-imports" "$repo/pyproject.toml" --no-cache
