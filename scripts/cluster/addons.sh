#!/usr/bin/env bash
# The test cluster's add-ons (addons/): CoreDNS, the local-path default StorageClass, Argo Workflows, the
# Kubeflow Training Operator (PyTorchJob).
# Renders each with the pinned versions and the module cache's manifests, applies it, waits until ready.
set -euo pipefail
source "$(dirname "$0")/env.sh"
out="$STATE/addons"; mkdir -p "$out/local-path" "$out/argo" "$out/training-operator"
render() {
  sed -e "s|COREDNS_VERSION|$COREDNS_VERSION|g; s|LOCAL_PATH_VERSION|$LOCAL_PATH_VERSION|g" \
      -e "s|ARGO_VERSION|$ARGO_VERSION|g; s|DNS_IP|$DNS_IP|g; s|STATE/|$STATE/|g" -e "s|MODULE_DIR|$2|g" \
      -e "s|TRAINING_OPERATOR_VERSION|$TRAINING_OPERATOR_VERSION|g" "$1"
}
modcache=$GOMODCACHE
render "$CLUSTER_DIR/addons/coredns.yaml" "" > "$out/coredns.yaml"
# kustomize takes a directory resource only by a relative path.
render "$CLUSTER_DIR/addons/local-path-kustomization.yaml" "$(realpath --relative-to "$out/local-path" \
  "$modcache/github.com/rancher/local-path-provisioner@$LOCAL_PATH_VERSION")" > "$out/local-path/kustomization.yaml"
render "$CLUSTER_DIR/addons/argo-kustomization.yaml" "$(realpath --relative-to "$out/argo" \
  "$modcache/github.com/argoproj/argo-workflows/v3@$ARGO_VERSION")" > "$out/argo/kustomization.yaml"
cp "$CLUSTER_DIR/addons/argo-namespace.yaml" "$out/argo/namespace.yaml"
render "$CLUSTER_DIR/addons/training-operator-kustomization.yaml" "$(realpath --relative-to "$out/training-operator" \
  "$modcache/github.com/kubeflow/training-operator@$TRAINING_OPERATOR_VERSION")" > "$out/training-operator/kustomization.yaml"
cp "$CLUSTER_DIR/addons/training-operator-init-container.yaml" "$out/training-operator/initContainer.yaml"
kc apply -f "$out/coredns.yaml" >/dev/null
kc kustomize --load-restrictor LoadRestrictionsNone "$out/local-path" | kc apply -f - >/dev/null
kc kustomize --load-restrictor LoadRestrictionsNone "$out/argo" | kc apply --server-side -f - >/dev/null
kc kustomize --load-restrictor LoadRestrictionsNone "$out/training-operator" | kc apply --server-side -f - >/dev/null
kc -n kube-system rollout status deploy/coredns --timeout 180s >/dev/null
kc -n local-path-storage rollout status deploy/local-path-provisioner --timeout 180s >/dev/null
kc -n argo rollout status deploy/workflow-controller --timeout 180s >/dev/null
# Ready once its webhook certificates are in place (its readiness probe waits for them).
kc -n kubeflow rollout status deploy/training-operator --timeout 180s >/dev/null
