#!/bin/bash
# Build the GPU and the TPU image here from their Dockerfiles with PyPI's torch builds (the PyTorch index is not
# reachable from this machine), one after the other; append each one's build seconds and size to
# bench/accelerator_images.jsonl. Needs a container engine: bash ../shared/tools/container-engine.sh sets one up.
#   bash bench/accelerator_images.sh            # add --no-cache through ADAPTUNE_DOCKER_BUILD_FLAGS for a cold build
set -uo pipefail
cd "$(dirname "$0")/.."
out=bench/accelerator_images.jsonl
# The official python:3.11-slim is a shared build (libpython3.11.so.1.0, which torch_xla links); the engine's stand-in
# of it is Debian's python3 without the library: add Debian's, as the official image has it (tests/test_accelerator_images.py).
base=docker.io/library/python:3.11-slim-bookworm
if ! docker run --rm "$base" sh -c 'ldconfig -p | grep -q libpython3.11.so.1.0'; then
  printf 'FROM %s\nRUN apt-get update -qq && apt-get install -y -qq --no-install-recommends libpython3.11 && rm -rf /var/lib/apt/lists/*\n' "$base" \
    | docker build --network host -q -t "$base" - >/dev/null
fi
for acc in gpu tpu; do
  start=$(date +%s)
  make -C containers "build-$acc" REGISTRY=localhost/adaptune TAG=dev \
    DOCKER_BUILD_FLAGS="--network host --build-arg TORCH_INDEX_URL=https://pypi.org/simple --build-arg TORCH_LOCAL_VERSION= ${ADAPTUNE_DOCKER_BUILD_FLAGS:-}" \
    > "/tmp/build-$acc.log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  size=$(docker image inspect "localhost/adaptune/adaptune-$acc:dev" --format '{{.Size}}' 2>/dev/null || echo null)
  echo "{\"date\": \"$(date -u +%F)\", \"image\": \"$acc\", \"exit\": $rc, \"build_s\": $seconds, \"size_bytes\": $size, \"code\": \"$(git describe --always --dirty)\"}" >> "$out"
done
