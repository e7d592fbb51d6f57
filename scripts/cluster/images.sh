#!/usr/bin/env bash
# Images of the test cluster. `images.sh build`: the add-ons' images (pause, CoreDNS, local-path
# provisioner, Argo's controller and executor, the training operator, a busybox tools image) from the
# binaries built here, with buildah from scratch, as OCI archives in $CACHE/images/addons.
# `images.sh import`: those and the project's own archives ($CACHE/images/<name>.oci.tar from `make images OFFLINE=1
# OCI_ARCHIVE_DIR=$CACHE/images`) into the cluster's containerd, each only when it changed.
set -euo pipefail
source "$(dirname "$0")/env.sh"
ADDONS="$CACHE/images/addons"
STORE=(--root "$CACHE/buildah/storage" --runroot "$RUN/buildah" --storage-driver vfs)

# addon NAME TAG ENTRYPOINT FILE...: an image of static programs in /bin (a directory: its contents) and a
# world-writable /tmp (as distroless images have: Argo's executor writes a resource template's manifest
# to /tmp/manifest.yaml in its init container, which mounts nothing there), run as root unless ADDON_USER
# names another uid (Argo's manifests ask for a non-root image user). Rebuilt when a file or this
# script is newer than its archive.
addon() {
  local name="$1" tag="$2" entry="$3" user="${ADDON_USER:-0}"; shift 3
  local out="$ADDONS/$name-$tag.oci.tar" ref="$IMAGE_PREFIX/$name:$tag" newest f
  newest=$(stat -L -c %Y "$@" "${BASH_SOURCE[0]}" | sort -n | tail -1)
  [ -s "$out" ] && [ "$(stat -c %Y "$out")" -ge "$newest" ] && return
  say "image $ref"
  local root="$CACHE/addon-root"
  mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"
  local c; c=$(buildah "${STORE[@]}" from --quiet scratch)
  buildah "${STORE[@]}" copy --quiet "$c" "$root" / >/dev/null
  for f in "$@"; do
    if [ -d "$f" ]; then buildah "${STORE[@]}" copy --quiet "$c" "$f" /bin >/dev/null
    else buildah "${STORE[@]}" copy --quiet "$c" "$(readlink -f "$f")" "/bin/$(basename "$f")" >/dev/null; fi
  done
  buildah "${STORE[@]}" config --entrypoint "$entry" --env PATH=/bin --user "$user" "$c"
  buildah "${STORE[@]}" commit --quiet --rm "$c" "$ref" >/dev/null
  rm -f "$out.tmp"
  buildah "${STORE[@]}" push --quiet "$ref" "oci-archive:$out.tmp:$ref"
  mv "$out.tmp" "$out"
}

build() {
  mkdir -p "$ADDONS" "$RUN"
  local pause="$CACHE/pause/pause"
  if [ ! -x "$pause" ] || [ "$CLUSTER_DIR/pause.c" -nt "$pause" ]; then
    mkdir -p "$(dirname "$pause")"
    gcc -static -Os -o "$pause" "$CLUSTER_DIR/pause.c"
  fi
  addon pause 3.10 '["/bin/pause"]' "$pause"
  # busybox-static with a link per applet (/bin/sh, mkdir, chown, ...): the shell and coreutils of the
  # local-path helper pods and of probe pods.
  local tools="$CACHE/tools"
  if [ ! -x "$tools/busybox" ] || [ /bin/busybox -nt "$tools/busybox" ]; then
    rm -rf "$tools"; mkdir -p "$tools"
    cp /bin/busybox "$tools/busybox"
    for applet in $(/bin/busybox --list); do [ "$applet" = busybox ] || ln -s busybox "$tools/$applet"; done
  fi
  addon tools 1 '["/bin/sh"]' "$tools"
  addon coredns "$COREDNS_VERSION" '["/bin/coredns"]' "$BIN/coredns"
  addon local-path-provisioner "$LOCAL_PATH_VERSION" '["/bin/local-path-provisioner"]' "$BIN/local-path-provisioner"
  # Argo's own images run as uid 8737; its controller's manifest requires a non-root user. Argo's init
  # container copies argoexec itself into each workflow pod (the emissary executor).
  ADDON_USER=8737 addon workflow-controller "$ARGO_VERSION" '["/bin/workflow-controller"]' "$BIN/workflow-controller"
  ADDON_USER=8737 addon argoexec "$ARGO_VERSION" '["/bin/argoexec"]' "$BIN/argoexec"
  addon training-operator "$TRAINING_OPERATOR_VERSION" '["/bin/training-operator"]' "$BIN/training-operator"
}

# import_archive ARCHIVE REF: import (unpacked for the CRI's snapshotter) and name it as the kubelet
# asks for it (docker.io/<ref> for a short name), unless the same archive was imported before.
import_archive() {
  local archive="$1" ref="$2" full stamp
  case "$ref" in */*/*) full="$ref" ;; *) full="docker.io/$ref" ;; esac
  stamp="$CACHE/imported/$(echo "$full" | tr '/:' '__')"
  mkdir -p "$CACHE/imported"
  if [ -f "$stamp" ] && [ "$stamp" -nt "$archive" ] && ctr_k8s images ls -q "name==$full" | grep -q .; then
    return
  fi
  say "import $full ($(du -h "$archive" | cut -f1))"
  local names
  names=$(ctr_k8s images import --all-platforms "$archive" | sed -n 's/^unpacking \(.*\) (sha256:.*/\1/p')
  local got; got=$(head -1 <<<"$names")
  [ -n "$got" ] || { echo "images: $archive holds no named image" >&2; return 1; }
  if [ "$got" != "$full" ]; then
    ctr_k8s images rm "$full" >/dev/null 2>&1 || true
    ctr_k8s images tag "$got" "$full" >/dev/null && ctr_k8s images rm "$got" >/dev/null
  fi
  touch "$stamp"
  echo "$full" >>"$CACHE/imported/changed"
}

# Also lists the references it imported in $CACHE/imported/changed (test.sh restarts what runs them: a
# re-imported tag does not replace a running container).
import() {
  local f name tag
  mkdir -p "$CACHE/imported"; : >"$CACHE/imported/changed"
  for f in "$ADDONS"/*.oci.tar; do
    name=$(basename "$f" .oci.tar); tag=${name##*-}; name=${name%-*}
    import_archive "$f" "$IMAGE_PREFIX/$name:$tag"
  done
  # The project's images: pipelines/cluster.py IMAGE_NAMES, as `make images` tags them.
  local project_tag="${TAG:-0.1.0}" registry="${REGISTRY:-orchard}"
  for f in "$CACHE/images"/*.oci.tar; do
    [ -e "$f" ] || continue
    import_archive "$f" "$registry/$(basename "$f" .oci.tar):$project_tag"
  done
}

case "${1:-}" in
  build) build ;;
  import) import ;;
  *) echo "usage: $0 build|import" >&2; exit 2 ;;
esac
