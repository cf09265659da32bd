#!/usr/bin/env bash
# The container back end's default image, localhost/envhub-base:bookworm: Debian 12 (minbase)
# with Python 3, built from Debian's packages (no registry is needed: mmdebstrap makes the root
# file system, the engine imports it). Also tagged localhost/debian:bookworm for tasks that
# build FROM it. Re-running it is quick when the image exists.
set -euo pipefail
ENGINE=${ENVHUB_CONTAINER_ENGINE:-podman}
IMAGE=localhost/envhub-base:bookworm
if $ENGINE image inspect "$IMAGE" >/dev/null 2>&1; then
    exit 0
fi
command -v mmdebstrap >/dev/null || { echo "container_base.sh needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
ROOTFS=$(mktemp -d)/rootfs.tar
trap 'rm -rf "$(dirname "$ROOTFS")"' EXIT
mmdebstrap --quiet --variant=minbase --include=python3,ca-certificates bookworm "$ROOTFS"
$ENGINE import --quiet "$ROOTFS" "$IMAGE" >/dev/null
$ENGINE tag "$IMAGE" localhost/debian:bookworm
echo "built $IMAGE"
