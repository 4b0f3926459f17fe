#!/usr/bin/env bash
# Build the sandbox image `mlrb-sandbox:latest` (the agent's and the scorer's containers).
#
#   bash docker/build.sh                         # FROM a Debian base built here, no registry needed
#   BASE_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime bash docker/build.sh   # FROM a public image
#
# With no BASE_IMAGE, a minimal Debian bookworm with python3 is made with debootstrap
# from the Debian mirror apt already uses, then imported as `mlrb-base:bookworm`: this
# works where no container registry can be reached. The harness's own Python and ML
# stack are mounted read-only into the containers at run time (sandbox.mount_host_python).
set -euo pipefail
cd "$(dirname "$0")"

IMAGE=${IMAGE:-mlrb-sandbox:latest}
BASE_IMAGE=${BASE_IMAGE:-}

if [[ -z "$BASE_IMAGE" ]]; then
    BASE_IMAGE=mlrb-base:bookworm
    if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        command -v debootstrap >/dev/null || { echo "debootstrap is needed: apt-get install debootstrap" >&2; exit 1; }
        # The mirror apt is configured with (deb822 sources or the classic list).
        MIRROR=$(grep -hoE '^URIs: *\S+' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | awk '{print $2}')
        [[ -n "$MIRROR" ]] || MIRROR=$(grep -hoE '^deb +\S+' /etc/apt/sources.list 2>/dev/null | head -1 | awk '{print $2}')
        MIRROR=${MIRROR:-http://deb.debian.org/debian}
        ROOTFS=$(mktemp -d)
        trap 'rm -rf "$ROOTFS"' EXIT
        echo "building $BASE_IMAGE with debootstrap from $MIRROR"
        debootstrap --variant=minbase --include=python3,procps bookworm "$ROOTFS" "$MIRROR" >/dev/null
        tar -C "$ROOTFS" -c . | docker import - "$BASE_IMAGE" >/dev/null
    fi
fi

docker build --quiet --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$IMAGE" . >/dev/null
echo "built $IMAGE (from $BASE_IMAGE)"
