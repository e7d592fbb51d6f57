#!/usr/bin/env bash
# Build orchard's images as <REGISTRY>/<name>:<TAG>, the names of pipelines/cluster.py IMAGE_NAMES (the
# same ones `orchard compile --image-registry REGISTRY --image-tag TAG` writes), with whichever of
# docker, podman or buildah works here. `make images REGISTRY=... TAG=...` calls this.
#
#   scripts/build-images.sh [NAME...]     every image, or the ones named
#   scripts/build-images.sh --list        the image names, one a line
#
# Environment:
#   REGISTRY=orchard TAG=0.1.0      the image references
#   BUILDER=docker|podman|buildah   force a builder (default: the first that works: docker or podman whose
#                                   engine answers, else buildah, daemonless, `--storage-driver vfs`)
#   BASE_IMAGE=IMAGE|local          base of every image (default: each Dockerfile's public base, e.g.
#                                   python:3.11-slim-bookworm). `local` needs no registry: a Debian bookworm
#                                   root with Python 3.11 built by scripts/build-base-rootfs.sh (mmdebstrap),
#                                   cached as $ORCHARD_IMAGE_CACHE/base-bookworm-py311-<key>.tar (key: a
#                                   hash of that script), imported once per image store.
#   WHEELHOUSE=1                    install Python packages only from docker/wheelhouse/ (no index in the
#                                   build): filled first by the host's pip from constraints.txt (a pip cache
#                                   for repeated builds; pinned; torch's CPU wheel from the host's find-links)
#   GPU_TORCH=cuda|cpu              torch of stage-runtime-gpu: cuda (default, the cu128 wheel from
#                                   download.pytorch.org) or cpu (same image, CPU wheel: builds offline)
#   OFFLINE=1                       BASE_IMAGE=local WHEELHOUSE=1 GPU_TORCH=cpu INJECTOR_PYTHON=debian: builds
#                                   with no container registry, no GitHub and no package index
#   INJECTOR_PYTHON=standalone|debian  the agent injector's Python: python-build-standalone via uv (default,
#                                   needs GitHub) or the base's Debian Python bundled with its libraries
#   OCI_ARCHIVE_DIR=DIR             also write DIR/<name>.oci.tar (`kind load image-archive`, `skopeo copy`)
#   INJECTOR_PLATFORMS=linux/amd64,linux/arm64  the agent injector (the one image every node runs: sandbox
#                                   pods land anywhere) as one multi-arch manifest list; the other images stay
#                                   single-arch. docker: `buildx build --push` (its image store cannot hold a
#                                   list; no archive). podman/buildah: a local list `--manifest <ref>` (push it
#                                   with `buildah manifest push --all <ref> docker://<ref>`); with OCI_ARCHIVE_DIR
#                                   the archive is the whole list (an OCI index of every platform). Foreign
#                                   platforms need binfmt/QEMU; BASE_IMAGE=local exists for this machine's only.
#   BUILDAH_LAYERS=true             cache every step as a layer (off: with vfs each cached step is a full
#                                   copy of the root, GBs for the stage runtime; the wheelhouse keeps
#                                   rebuilds offline and fast enough)
#   ORCHARD_IMAGE_CACHE=DIR         where the local base is cached (default ~/.cache/orchard/images)
set -euo pipefail
cd "$(dirname "$0")/.."
REGISTRY=${REGISTRY:-orchard}
if [ -n "${OFFLINE:-}" ]; then
  # Each stays overridable (WHEELHOUSE= with an empty value turns the wheelhouse off).
  BASE_IMAGE=${BASE_IMAGE-local} WHEELHOUSE=${WHEELHOUSE-1} GPU_TORCH=${GPU_TORCH-cpu}
  INJECTOR_PYTHON=${INJECTOR_PYTHON-debian}
fi
TAG=${TAG:-0.1.0}
CACHE=${ORCHARD_IMAGE_CACHE:-$HOME/.cache/orchard/images}
# The cached base is keyed by the script that builds it: a changed package list builds a new one.
BASE_KEY=$(sha256sum scripts/build-base-rootfs.sh | cut -c1-12)
LOCAL_BASE=localhost/orchard-base:bookworm-py311-$BASE_KEY
STORAGE=(--storage-driver "${BUILDAH_STORAGE_DRIVER:-vfs}")

die() { echo "build-images: $1" >&2; exit "${2:-2}"; }

# The local base is imported for this machine's architecture only: a foreign platform has no base.
check_injector_platforms() {
  [ -n "${INJECTOR_PLATFORMS:-}" ] && [ "${BASE_IMAGE:-}" = local ] || return 0
  local own platform
  case "$HOSTTYPE" in x86_64) own=linux/amd64 ;; aarch64) own=linux/arm64 ;; *) own=linux/$HOSTTYPE ;; esac
  for platform in ${INJECTOR_PLATFORMS//,/ }; do
    [ "$platform" = "$own" ] || die "INJECTOR_PLATFORMS=$INJECTOR_PLATFORMS with BASE_IMAGE=local: the local base is $own only; use a public BASE_IMAGE (e.g. unset it) for $platform"
  done
}

# The names live in pipelines/cluster.py only; read them without importing the project (no venv needed).
image_names() {
  python3 - <<'PY'
import ast
tree = ast.parse(open("pipelines/cluster.py").read())
for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "IMAGE_NAMES" for t in node.targets):
        print("\n".join(ast.literal_eval(node.value)))
PY
}

# A builder counts only if it can build now: the docker CLI without a reachable engine (`docker info`
# fails) does not, nor does podman without a working service. buildah has no daemon: it works if it runs
# (not `buildah images`, which waits for the store's lock while another build holds it).
builder_works() {
  case "$1" in
    docker) timeout 20 docker info >/dev/null 2>&1 ;;
    podman) timeout 20 podman info >/dev/null 2>&1 ;;
    buildah) timeout 20 buildah version >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac
}

pick_builder() {
  if [ -n "${BUILDER:-}" ]; then
    case "$BUILDER" in docker|podman|buildah) ;; *) die "unknown BUILDER=$BUILDER (docker, podman or buildah)";; esac
    command -v "$BUILDER" >/dev/null 2>&1 || die "BUILDER=$BUILDER is not installed" 127
    builder_works "$BUILDER" || die "BUILDER=$BUILDER does not work here ('$BUILDER info' fails: is its engine running?)" 127
    echo "$BUILDER"; return
  fi
  local tried=()
  for candidate in docker podman buildah; do
    if ! command -v "$candidate" >/dev/null 2>&1; then tried+=("$candidate not installed"); continue; fi
    if builder_works "$candidate"; then echo "$candidate"; return; fi
    tried+=("$candidate installed but not working")
  done
  local IFS=,
  die "no working image builder (${tried[*]}); start the docker engine, or install podman or buildah (Debian: apt-get install buildah)" 127
}

# <name> -> "<Dockerfile> <build args...>"; stage-runtime-gpu is stage-runtime with the CUDA torch.
dockerfile_args() {
  case "$1" in
    stage-runtime-gpu)
      echo "docker/stage-runtime/Dockerfile"
      if [ "${GPU_TORCH:-cuda}" = cuda ]; then
        echo "--build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 --build-arg TORCH_SPEC=torch==2.13.0"
      else
        [ "${GPU_TORCH}" = cpu ] || die "GPU_TORCH=$GPU_TORCH: use cuda or cpu"
      fi ;;
    agent-injector)
      echo "docker/agent-injector/Dockerfile"
      # Its final stage defaults to busybox:1.37; offline it is scratch plus the local base's static busybox.
      [ "${BASE_IMAGE:-}" != local ] || echo "--build-arg FINAL_BASE_IMAGE=scratch"
      [ -z "${INJECTOR_PYTHON:-}" ] || echo "--build-arg PYTHON_SOURCE=$INJECTOR_PYTHON" ;;
    *) echo "docker/$1/Dockerfile" ;;
  esac
}

# Offline base: the rootfs tar is cached (mmdebstrap runs once per cache dir), the import once per store.
local_base() {
  local tar="$CACHE/base-bookworm-py311-$BASE_KEY.tar"
  [ -s "$tar" ] || scripts/build-base-rootfs.sh "$tar" >&2
  local env=(PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)
  case "$builder" in
    buildah)
      buildah "${STORAGE[@]}" inspect --type image "$LOCAL_BASE" >/dev/null 2>&1 && return 0
      local ctr
      ctr=$(buildah "${STORAGE[@]}" from --quiet scratch)
      buildah "${STORAGE[@]}" add --quiet "$ctr" "$tar" / >/dev/null
      buildah "${STORAGE[@]}" config --env "${env[0]}" --env "${env[1]}" --cmd python3 "$ctr"
      buildah "${STORAGE[@]}" commit --quiet --rm "$ctr" "$LOCAL_BASE" >/dev/null ;;
    docker|podman)
      "$builder" image inspect "$LOCAL_BASE" >/dev/null 2>&1 && return 0
      "$builder" import --change "ENV ${env[0]}" --change "ENV ${env[1]}" --change 'CMD ["python3"]' \
        "$tar" "$LOCAL_BASE" >/dev/null ;;
  esac
  echo "build-images: imported the local base $LOCAL_BASE from $tar" >&2
}

# Every wheel the images install, for python 3.11 on linux x86_64 like the base images; pip skips the
# ones already there, so the wheelhouse doubles as the cache of repeated builds.
fill_wheelhouse() {
  local py=${PYTHON:-.venv/bin/python} uv extras data
  [ -x "$py" ] || py=python3
  uv=$(sed -n 's/^ARG UV_VERSION=//p' docker/agent-injector/Dockerfile)
  extras=$(sed -n 's/^ARG STAGE_EXTRAS=//p' docker/stage-runtime/Dockerfile)
  # The extras the stage image installs without dependencies (data wheels): downloaded the same way.
  data=$(python3 -m pipelines.image_extras "$(sed -n 's/^ARG STAGE_DATA_EXTRAS=//p' docker/stage-runtime/Dockerfile)") \
    || die "reading the stage image's data extras from pyproject.toml failed" 1
  echo "build-images: filling docker/wheelhouse from constraints.txt ($py -m pip download)" >&2
  # The host's pip config may list index paths this machine lacks; its warnings about them are noise.
  "$py" -m pip download -q -d docker/wheelhouse -c <(grep -v '^torch==' constraints.txt) \
    "$(grep '^torch==' constraints.txt)" ".[$extras]" pip setuptools wheel "uv==$uv" \
    -r docker/sandbox-service/requirements.txt -r docker/mlflow/requirements.txt \
    2> >(grep -v 'is ignored: it is neither' >&2) || die "pip download into docker/wheelhouse failed" 1
  # shellcheck disable=SC2086  # requirement strings without spaces
  [ -z "$data" ] || "$py" -m pip download -q --no-deps -d docker/wheelhouse $data \
    2> >(grep -v 'is ignored: it is neither' >&2) || die "pip download --no-deps $data into docker/wheelhouse failed" 1
}

build_one() {
  local name=$1 ref="$REGISTRY/$1:$TAG" spec dockerfile out="" platforms=""
  [ "$name" != agent-injector ] || platforms=${INJECTOR_PLATFORMS:-}
  spec=$(dockerfile_args "$name")
  dockerfile=$(head -1 <<<"$spec")
  [ -f "$dockerfile" ] || die "no Dockerfile for image '$name' ($dockerfile)"
  # shellcheck disable=SC2206  # the build args are words without spaces
  local args=($(tail -n +2 <<<"$spec" | tr '\n' ' '))
  [ -n "${BASE_IMAGE:-}" ] && args+=(--build-arg "BASE_IMAGE=$base")
  # The wheelhouse holds torch as constraints.txt pins it (PyPI's default build): no +cpu local build.
  [ -n "${WHEELHOUSE:-}" ] && args+=(--build-arg PIP_OFFLINE=1 --build-arg "TORCH_SPEC=$(grep '^torch==' constraints.txt)")
  local start=$SECONDS key="$dockerfile ${args[*]}"
  local same=${built_from[$key]:-}
  if [ -n "$same" ]; then
    # Same Dockerfile, same arguments (stage-runtime-gpu with GPU_TORCH=cpu): the same image, tagged.
    echo "build-images: $ref is $same (same Dockerfile and build arguments): tagged" >&2
    case "$builder" in
      docker|podman) "$builder" tag "$same" "$ref" ;;
      buildah) buildah "${STORAGE[@]}" tag "$same" "$ref" ;;
    esac
  else
    echo "build-images: $builder building $ref from $dockerfile${platforms:+ for $platforms}" >&2
    local bud=(bud --quiet --layers="${BUILDAH_LAYERS:-false}" --isolation "${BUILDAH_ISOLATION:-chroot}")
    case "$builder${platforms:+/multi}" in
      docker|podman) "$builder" build -f "$dockerfile" -t "$ref" "${args[@]}" . ;;
      buildah) buildah "${STORAGE[@]}" "${bud[@]}" -f "$dockerfile" -t "$ref" "${args[@]}" . >/dev/null ;;
      docker/multi) docker buildx build --platform "$platforms" -f "$dockerfile" -t "$ref" --push "${args[@]}" . ;;
      # --manifest adds to an existing list: drop the previous build's list first (absent: nothing to drop).
      podman/multi) podman manifest rm "$ref" >/dev/null 2>&1 || true
        podman build --platform "$platforms" -f "$dockerfile" --manifest "$ref" "${args[@]}" . ;;
      buildah/multi) buildah "${STORAGE[@]}" manifest rm "$ref" >/dev/null 2>&1 || true
        buildah "${STORAGE[@]}" "${bud[@]}" --platform "$platforms" -f "$dockerfile" --manifest "$ref" "${args[@]}" . >/dev/null ;;
    esac
    built_from[$key]=$ref
  fi
  if [ -n "${OCI_ARCHIVE_DIR:-}" ]; then
    mkdir -p "$OCI_ARCHIVE_DIR"
    out="$OCI_ARCHIVE_DIR/$name.oci.tar"
    rm -f "$out"
    case "$builder${platforms:+/multi}" in
      buildah) buildah "${STORAGE[@]}" push --quiet "$ref" "oci-archive:$out:$ref" ;;
      podman) podman save --format oci-archive -o "$out" "$ref" ;;
      docker) docker save -o "$out" "$ref" ;;  # docker >= 25 writes an OCI layout; kind loads both
      # The list and every platform's image: an OCI index whose entry is the list (buildah >= 1.28).
      buildah/multi) buildah "${STORAGE[@]}" manifest push --quiet --all "$ref" "oci-archive:$out:$ref" ;;
      podman/multi) podman manifest push --all "$ref" "oci-archive:$out:$ref" ;;
      docker/multi) echo "build-images: docker pushed $ref (a manifest list); no archive of it written" >&2; out="" ;;
    esac
  fi
  echo "build-images: built $ref in $((SECONDS - start)) s${out:+, wrote $out ($(du -h "$out" | cut -f1))}" >&2
}

[ "${1:-}" = --list ] && { image_names; exit 0; }
mapfile -t all < <(image_names)
[ ${#all[@]} -gt 0 ] || die "no IMAGE_NAMES in pipelines/cluster.py"
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${all[@]}")
for name in "${names[@]}"; do
  printf '%s\n' "${all[@]}" | grep -qx "$name" || die "unknown image '$name'; the images are: ${all[*]}"
done

check_injector_platforms
builder=$(pick_builder)
declare -A built_from=()  # "<Dockerfile> <args>" -> the reference built from them
base=${BASE_IMAGE:-}
if [ "$base" = local ]; then local_base; base=$LOCAL_BASE; fi
[ -n "${WHEELHOUSE:-}" ] && fill_wheelhouse
for name in "${names[@]}"; do build_one "$name"; done
