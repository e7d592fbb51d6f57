#!/usr/bin/env bash
# End-to-end smoke test on a real cluster (the path no CI here exercises), following the README's
# "Cluster quickstart" step by step.
#
#   scripts/smoke-k8s.sh                 # a kind cluster named "orchard" (created if missing)
#   KIND_CLUSTER=mine scripts/smoke-k8s.sh
#   NO_KIND=1 REGISTRY=registry.example/orchard scripts/smoke-k8s.sh   # any cluster: images are pushed
#   ARGO=1 scripts/smoke-k8s.sh          # also install Argo Workflows and run the pipeline (preset tiny)
#
# Needs: docker, podman or buildah for the builds (scripts/build-images.sh; OFFLINE=1 builds without
# registries), skopeo or docker to push (NO_KIND=1), kubectl, kind (unless NO_KIND=1), the repo's .venv
# (make install), a CNI that enforces NetworkPolicy for the egress check (otherwise that check reports
# "not enforced"); ARGO=1 needs the argo CLI and internet access for Argo's install manifest.
# Steps (README "Cluster quickstart"): 1 cluster -> 2 `make images` (every image of pipelines/cluster.py)
# -> 3 load them into kind (or push) -> 4 `kubectl apply -k manifests/overlays/dev` -> 5 secrets ->
# 6 through the REST API (port-forward): create a sandbox from an image WITHOUT Python
# (debian:bookworm-slim: the injected interpreter runs the agent), exec, round-trip a file, check that
# no service-account token is mounted and egress is denied, snapshot, restore, fork, check that a bad
# image fails as IMAGE_PULL_FAILED, delete, and that no pod, Secret or NetworkPolicy of a sandbox is
# left -> 7 (ARGO=1) `orchard compile`, `argo template create`, `argo submit --from
# workflowtemplate/orchard-training --wait`, and the CronWorkflow.
set -euo pipefail

cd "$(dirname "$0")/.."
NAMESPACE=orchard  # pipelines/cluster.py ClusterConfig.namespace
SANDBOX_NAMESPACE=orchard-sandboxes  # ClusterConfig.sandbox_namespace: sandbox pods, Secrets, NetworkPolicies
CLUSTER=${KIND_CLUSTER:-orchard}
PORT=${SMOKE_PORT:-18765}
TAG=${TAG:-0.1.0}
TASK_IMAGE=${TASK_IMAGE:-debian:bookworm-slim}
PY=${PY:-.venv/bin/python}
IMAGES=$(scripts/build-images.sh --list)  # pipelines/cluster.py IMAGE_NAMES

say() { printf '\n== %s\n' "$*"; }
need() { command -v "$1" >/dev/null || { echo "smoke-k8s: '$1' is required" >&2; exit 2; }; }
need kubectl
[ -x "$PY" ] || { echo "smoke-k8s: $PY missing; run 'make install' first" >&2; exit 2; }

if [ -z "${NO_KIND:-}" ]; then
  need kind
  if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    say "1. creating kind cluster $CLUSTER"
    kind create cluster --name "$CLUSTER" --wait 120s
  fi
  kubectl config use-context "kind-$CLUSTER" >/dev/null
fi

if [ -z "${NO_KIND:-}" ]; then
  say "2. building images: $IMAGES"
  make images REGISTRY=orchard TAG="$TAG" OCI_ARCHIVE_DIR=build/images
  say "3. loading images into kind"
  for image in $IMAGES; do kind load image-archive --name "$CLUSTER" "build/images/$image.oci.tar"; done
  docker pull -q "$TASK_IMAGE" >/dev/null && kind load docker-image --name "$CLUSTER" "$TASK_IMAGE"
  OVERLAY=manifests/overlays/dev
  BUILD_REGISTRY=orchard
else
  BUILD_REGISTRY=${REGISTRY:?set REGISTRY to push images when NO_KIND=1}
  say "2. building images: $IMAGES"
  make images REGISTRY="$REGISTRY" TAG="$TAG" OCI_ARCHIVE_DIR=build/images
  say "3. pushing images to $REGISTRY"
  # From the archives, so it works whichever builder made them (skopeo, else the docker CLI).
  for image in $IMAGES; do
    if command -v skopeo >/dev/null; then
      skopeo copy "oci-archive:build/images/$image.oci.tar" "docker://$REGISTRY/$image:$TAG"
    else
      docker push -q "$REGISTRY/$image:$TAG"
    fi
  done
  # A throwaway overlay on top of dev that points the images at the registry.
  OVERLAY=$(mktemp -d)
  cat > "$OVERLAY/kustomization.yaml" <<EOF
resources: ["$(realpath --relative-to="$OVERLAY" manifests/overlays/dev)"]
images:
  - {name: orchard/sandbox-service, newName: $REGISTRY/sandbox-service, newTag: $TAG}
  - {name: orchard/mlflow, newName: $REGISTRY/mlflow, newTag: $TAG}
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: orchard-sandbox-service}
      spec:
        template:
          spec:
            containers:
              - name: sandbox-service
                env:
                  - {name: ORCHARD_K8S_INJECTOR_IMAGE, value: $REGISTRY/agent-injector:$TAG}
EOF
fi

say "4. applying $OVERLAY (dev creates the token Secret; 5. adds the optional endpoint Secret)"
kubectl apply -k "$OVERLAY"
kubectl -n "$NAMESPACE" rollout status deploy/orchard-sandbox-service --timeout=180s
kubectl -n "$NAMESPACE" create secret generic orchard-endpoints --from-literal=api-key="${OPENAI_API_KEY:-unused}" \
  --dry-run=client -o yaml | kubectl apply -f -

secret=$(kubectl -n "$NAMESPACE" get deploy orchard-sandbox-service \
  -o jsonpath='{.spec.template.spec.containers[0].env[?(@.name=="ORCHARD_SANDBOX_TOKEN")].valueFrom.secretKeyRef.name}')
TOKEN=$(kubectl -n "$NAMESPACE" get secret "$secret" -o jsonpath='{.data.token}' | base64 -d)

kubectl -n "$NAMESPACE" port-forward svc/orchard-sandbox-service "$PORT:8765" >/tmp/orchard-port-forward.log 2>&1 &
PF=$!
trap 'kill $PF 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.2; done

say "6. exercising the REST API"
ORCHARD_URL="http://127.0.0.1:$PORT" ORCHARD_SANDBOX_TOKEN="$TOKEN" TASK_IMAGE="$TASK_IMAGE" "$PY" - <<'EOF'
import os, time
from sandbox_service.client import SandboxClient
from sandbox_service.errors import BackendUnavailableError
from sandbox_service.models import SandboxCreate, NetworkPolicy

client = SandboxClient(os.environ["ORCHARD_URL"], os.environ["ORCHARD_SANDBOX_TOKEN"], timeout=60)
t0 = time.perf_counter()
with client.create(SandboxCreate(image=os.environ["TASK_IMAGE"], labels={"smoke": "k8s"}), wait_timeout=300) as sb:
    print(f"ready in {time.perf_counter() - t0:.1f} s: {sb.id}")
    r = sb.exec("echo hello from $(hostname); cat /etc/os-release | head -1")
    assert r.ok and "hello from" in r.stdout, r
    print(r.stdout.strip())
    sb.write_file("/workspace/a.txt", "smoke")
    assert sb.read_file("/workspace/a.txt") == b"smoke"
    r = sb.exec("ls /var/run/secrets/kubernetes.io/serviceaccount 2>&1; env | grep -c KUBERNETES_ || true")
    assert "No such file" in r.stdout, f"a service-account token is mounted: {r.stdout}"
    r = sb.exec("timeout 5 bash -c 'echo > /dev/tcp/1.1.1.1/443' && echo OPEN || echo DENIED", timeout_seconds=20)
    print("egress with network=none:", r.stdout.strip(), "(OPEN means the CNI does not enforce NetworkPolicy)")
    snap = sb.snapshot()
    sb.write_file("/workspace/a.txt", "changed")
    sb.restore(snap.id)
    assert sb.read_file("/workspace/a.txt") == b"smoke"
    with client.create(SandboxCreate(image=os.environ["TASK_IMAGE"], from_snapshot=snap.id), wait_timeout=300) as fork:
        assert fork.read_file("/workspace/a.txt") == b"smoke"
    print("snapshot, restore and fork: ok")
try:
    client.create(SandboxCreate(image="orchard/does-not-exist:0"), wait_timeout=300)
    raise SystemExit("a sandbox from a missing image became ready")
except BackendUnavailableError as err:
    assert "IMAGE_PULL_FAILED" in str(err) or "pull" in str(err).lower(), err
    print("bad image:", str(err)[:160])
print("REST checks: ok")
EOF

say "checking that nothing leaked"
for _ in $(seq 60); do
  # (the instance's shared deny policy, component sandbox-network, outlives sandboxes on purpose)
  left=$(kubectl -n "$SANDBOX_NAMESPACE" get pods,secrets,networkpolicies \
    -l app.kubernetes.io/managed-by=orchard,app.kubernetes.io/component=sandbox -o name)
  [ -z "$left" ] && break
  sleep 1
done
if [ -n "$left" ]; then echo "LEAKED:"; echo "$left"; exit 1; fi
if [ -n "${ARGO:-}" ]; then
  need argo
  say "7. Argo Workflows: install, compile, template create, submit (preset tiny), schedule"
  kubectl get ns argo >/dev/null 2>&1 || kubectl create namespace argo
  kubectl apply -n argo -f "https://github.com/argoproj/argo-workflows/releases/download/${ARGO_VERSION:-v3.6.4}/quick-start-minimal.yaml"
  kubectl -n argo rollout status deploy/workflow-controller --timeout=300s
  "$PY" -m pipelines.cli compile --out build/pipelines --image-registry "$BUILD_REGISTRY" --image-tag "$TAG"
  argo -n "$NAMESPACE" template create build/pipelines/orchard-training.workflowtemplate.yaml
  argo -n "$NAMESPACE" submit --from workflowtemplate/orchard-training -p preset=tiny \
    -p gpu_node_selector='{}' -p gpu_tolerations='[]' --wait --log
  kubectl -n "$NAMESPACE" apply -f build/pipelines/orchard-retrain.cronworkflow.yaml
  argo -n "$NAMESPACE" cron list
fi
say "smoke-k8s: all checks passed"
