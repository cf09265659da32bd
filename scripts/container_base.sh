#!/usr/bin/env bash
# The container back end's images, built from Debian's packages (no image registry is needed):
# - localhost/envhub-base:bookworm, the default: Debian 12 (minbase) with Python 3 (mmdebstrap
#   makes the root file system, the engine imports it); also tagged localhost/debian:bookworm
#   for tasks that build FROM it.
# - localhost/envhub-python:bookworm, the stand-in for the official python:* images (the
#   default image map sends them to it): the base with pip (installing system-wide, as in
#   those images), venv, a `python` command, and this machine's CA bundle (a proxy's CA lets
#   a task's `RUN pip install` reach the package index at build time).
# Re-running it is quick when the images exist.
set -euo pipefail
ENGINE=${ENVHUB_CONTAINER_ENGINE:-podman}
IMAGE=localhost/envhub-base:bookworm
PYTHON_IMAGE=localhost/envhub-python:bookworm
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if ! $ENGINE image inspect "$IMAGE" >/dev/null 2>&1; then
    command -v mmdebstrap >/dev/null || { echo "container_base.sh needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
    mmdebstrap --quiet --variant=minbase --include=python3,ca-certificates bookworm "$WORK/rootfs.tar"
    $ENGINE import --quiet "$WORK/rootfs.tar" "$IMAGE" >/dev/null
    $ENGINE tag "$IMAGE" localhost/debian:bookworm
    rm -f "$WORK/rootfs.tar"
    echo "built $IMAGE"
fi

if ! $ENGINE image inspect "$PYTHON_IMAGE" >/dev/null 2>&1; then
    cp /etc/ssl/certs/ca-certificates.crt "$WORK/ca-certificates.crt"
    cat > "$WORK/Containerfile" <<CONTAINERFILE
FROM $IMAGE
RUN export DEBIAN_FRONTEND=noninteractive && apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends python3-pip python3-venv python-is-python3 \
        >/dev/null \
    && rm -rf /var/lib/apt/lists/* /usr/lib/python3.*/EXTERNALLY-MANAGED \
    && ln -sf /usr/bin/pip3 /usr/local/bin/pip
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
CONTAINERFILE
    # These machines' hard limits are under the engine's defaults (see container_engine.py).
    $ENGINE build --quiet --network=host --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
        -t "$PYTHON_IMAGE" -f "$WORK/Containerfile" "$WORK" >/dev/null
    echo "built $PYTHON_IMAGE"
fi
