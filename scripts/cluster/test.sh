#!/usr/bin/env bash
# `make test-cluster`: the project on the single-node cluster, phase by phase, each phase's time printed.
#   1 cluster-up (if not up)   2 images: `make images OFFLINE=1` + the add-ons', imported into containerd
#   3 tests/cluster (marker `cluster`): deploy manifests/overlays/dev, the Kubernetes backend on real pods,
#     the Argo pipeline (preset tiny) + MLflow + a CronWorkflow run on the grown data store
#   4 cluster-down, which fails if the host is not as before (KEEP_CLUSTER=1 skips it)
# A failing test prints the events and logs of the pods that are not healthy. Arguments go to pytest,
# e.g. `scripts/cluster/test.sh -k 'pipeline or cron'` (KEEP_CLUSTER=1 for a cluster already up).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/cluster/env.sh
PY=${PY:-.venv/bin/python}
declare -a timings=()
timed() {
  local name="$1" start=$SECONDS; shift
  "$@"
  timings+=("$(printf '%-22s %5d s' "$name" $((SECONDS - start)))")
  say "phase $name: $((SECONDS - start)) s"
}
report() { printf '\n== test-cluster phases\n'; printf '%s\n' "${timings[@]}"; }
trap report EXIT

if [ ! -e "$NETNS_PATH" ]; then
  # A new machine has neither the cache directory nor the image builder: both before the first build.
  mkdir -p "$CACHE"
  scripts/cluster/install-deps.sh
  # The images first: cluster-up imports whatever archives exist. Their local Debian base is cached with
  # the cluster's (cluster-clean drops it too).
  export ORCHARD_IMAGE_CACHE="${ORCHARD_IMAGE_CACHE:-$CACHE/image-base}"
  timed images-build bash -c "make images OFFLINE=1 OCI_ARCHIVE_DIR='$CACHE/images' >'$CACHE/images-build.log' 2>&1 \
    || { tail -30 '$CACHE/images-build.log'; exit 1; }"
  # The archives are what the node imports: buildah's vfs copies of the same images (GBs each; a node
  # short of disk evicts pods and deletes images it cannot pull back) go.
  for name in $(scripts/build-images.sh --list); do
    buildah --storage-driver vfs rmi -f "${REGISTRY:-orchard}/$name:${TAG:-0.1.0}" >/dev/null 2>&1 || true
  done
  timed cluster-up scripts/cluster/up.sh
else
  timed images-import scripts/cluster/images.sh import
fi
export KUBECONFIG="$KUBECONFIG_ADMIN" ORCHARD_TEST_CLUSTER=1
# A tag imported again (a rebuilt image) does not replace running containers: restart the Deployments of
# namespace orchard that run an image just imported, so the tests run what was just built.
restart_rebuilt() {
  local deploy image
  for deploy in $(kubectl -n orchard get deploy -o name 2>/dev/null); do
    for image in $(kubectl -n orchard get "$deploy" -o jsonpath='{.spec.template.spec.containers[*].image}'); do
      case "$image" in */*/*) ;; *) image="docker.io/$image" ;; esac
      if grep -qxF "$image" "$CACHE/imported/changed" 2>/dev/null; then
        kubectl -n orchard rollout restart "$deploy" && kubectl -n orchard rollout status "$deploy" --timeout 300s
        break
      fi
    done
  done
}
timed restart-rebuilt restart_rebuilt
timed tests "$PY" -m pytest -m cluster tests/cluster -p no:cacheprovider -s -v --timeout 4000 "$@"
[ -n "${KEEP_CLUSTER:-}" ] || timed cluster-down scripts/cluster/down.sh
