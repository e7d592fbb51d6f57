#!/usr/bin/env bash
# Build one orchard image with whichever builder is installed: docker, podman or buildah (no daemon).
#   scripts/build-image.sh NAME REF        e.g. scripts/build-image.sh stage-runtime orchard/stage-runtime:0.1.0
# NAME is one of pipelines/cluster.py IMAGE_NAMES; `make images REGISTRY=... TAG=...` calls this for each.
# Environment:
#   BUILDER=docker|podman|buildah   force a builder (default: the first one found, in that order)
#   BASE=IMAGE                      base image of every stage (default: each Dockerfile's public base);
#                                   e.g. a locally built Debian+Python root (scripts/build-images-offline.sh)
#   OCI_ARCHIVE_DIR=DIR             also write DIR/NAME.oci.tar (for `kind load image-archive`, `skopeo copy`)
#   PLATFORMS=linux/amd64,linux/arm64  one multi-arch manifest list REF (podman/buildah: local, push it with
#                                   `buildah manifest push --all REF docker://REF`; docker: buildx pushes REF,
#                                   its image store cannot hold a list); foreign ones need binfmt/QEMU
set -euo pipefail
name=${1:?usage: build-image.sh NAME REF}
ref=${2:?usage: build-image.sh NAME REF}
cd "$(dirname "$0")/.."

dockerfile="docker/$name/Dockerfile"
args=()
case "$name" in
  stage-runtime-gpu)  # the CUDA wheel of the same torch; the node needs only the NVIDIA driver
    dockerfile=docker/stage-runtime/Dockerfile
    args+=(--build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 --build-arg TORCH_SPEC=torch==2.13.0) ;;
esac
[ -f "$dockerfile" ] || { echo "build-image: no Dockerfile for image '$name' ($dockerfile)" >&2; exit 2; }
[ -n "${BASE:-}" ] && args+=(--build-arg "BASE=$BASE")

builder=${BUILDER:-}
if [ -z "$builder" ]; then
  for candidate in docker podman buildah; do
    if command -v "$candidate" >/dev/null 2>&1; then builder=$candidate; break; fi
  done
fi
if [ -z "$builder" ]; then
  echo "build-image: no image builder found; install one of docker, podman or buildah (Debian: apt-get install buildah)" >&2
  exit 127
fi

echo "build-image: $builder building $ref from $dockerfile${PLATFORMS:+ for $PLATFORMS}"
case "$builder${PLATFORMS:+/multi}" in
  docker|podman) "$builder" build -f "$dockerfile" -t "$ref" "${args[@]}" . ;;
  buildah) buildah --storage-driver "${BUILDAH_STORAGE_DRIVER:-vfs}" bud --quiet -f "$dockerfile" -t "$ref" "${args[@]}" . ;;
  docker/multi) docker buildx build --platform "$PLATFORMS" -f "$dockerfile" -t "$ref" --push "${args[@]}" . ;;
  podman/multi) podman build --platform "$PLATFORMS" -f "$dockerfile" --manifest "$ref" "${args[@]}" . ;;
  buildah/multi) buildah --storage-driver "${BUILDAH_STORAGE_DRIVER:-vfs}" bud --quiet --platform "$PLATFORMS" \
                   -f "$dockerfile" --manifest "$ref" "${args[@]}" . ;;
  *) echo "build-image: unknown BUILDER=$builder (docker, podman or buildah)" >&2; exit 2 ;;
esac

if [ -n "${OCI_ARCHIVE_DIR:-}" ]; then
  mkdir -p "$OCI_ARCHIVE_DIR"
  out="$OCI_ARCHIVE_DIR/$name.oci.tar"
  rm -f "$out"
  case "$builder${PLATFORMS:+/multi}" in
    buildah/multi) buildah --storage-driver "${BUILDAH_STORAGE_DRIVER:-vfs}" manifest push --quiet --all "$ref" \
                     "oci-archive:$out:$ref" ;;
    podman/multi) podman manifest push --all "$ref" "oci-archive:$out:$ref" ;;
    docker/multi) echo "build-image: docker pushed $ref (a multi-arch list); no archive written" >&2; exit 0 ;;
    buildah) buildah --storage-driver "${BUILDAH_STORAGE_DRIVER:-vfs}" push --quiet "$ref" "oci-archive:$out:$ref" ;;
    podman) podman save --format oci-archive -o "$out" "$ref" ;;
    docker) docker save -o "$out" "$ref" ;;
  esac
  echo "build-image: wrote $out"
fi
