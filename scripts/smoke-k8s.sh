#!/usr/bin/env bash
# End-to-end smoke test of the Kubernetes backend on a real cluster (the path no CI here exercises).
#
#   scripts/smoke-k8s.sh                 # a kind cluster named "orchard" (created if missing)
#   KIND_CLUSTER=mine scripts/smoke-k8s.sh
#   NO_KIND=1 REGISTRY=registry.example/orchard scripts/smoke-k8s.sh   # any cluster: images are pushed
#
# Needs: docker, kubectl, kind (unless NO_KIND=1), the repo's .venv (make install), a CNI that
# enforces NetworkPolicy for the egress check (otherwise that check reports "not enforced").
# What it does: builds the sandbox-service, agent-injector and mlflow images, loads them into the
# cluster, applies manifests/overlays/dev, then through the REST API (port-forward) creates a sandbox
# from an image WITHOUT Python (debian:bookworm-slim: the injected interpreter runs the agent), execs,
# round-trips a file, checks that no service-account token is mounted and egress is denied,
# snapshots, restores, forks, checks that a bad image fails as IMAGE_PULL_FAILED, deletes, and
# finally checks that no pod, Secret or NetworkPolicy of a sandbox is left in the namespace.
set -euo pipefail

cd "$(dirname "$0")/.."
NAMESPACE=orchard-dev
CLUSTER=${KIND_CLUSTER:-orchard}
PORT=${SMOKE_PORT:-18765}
TAG=dev
TASK_IMAGE=${TASK_IMAGE:-debian:bookworm-slim}
PY=${PY:-.venv/bin/python}

say() { printf '\n== %s\n' "$*"; }
need() { command -v "$1" >/dev/null || { echo "smoke-k8s: '$1' is required" >&2; exit 2; }; }
need docker; need kubectl
[ -x "$PY" ] || { echo "smoke-k8s: $PY missing; run 'make install' first" >&2; exit 2; }

if [ -z "${NO_KIND:-}" ]; then
  need kind
  if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    say "creating kind cluster $CLUSTER"
    kind create cluster --name "$CLUSTER" --wait 120s
  fi
  kubectl config use-context "kind-$CLUSTER" >/dev/null
fi

say "building images"
for image in sandbox-service agent-injector mlflow; do
  docker build -q -f "docker/$image/Dockerfile" -t "orchard/$image:$TAG" .
done
docker pull -q "$TASK_IMAGE" >/dev/null

if [ -z "${NO_KIND:-}" ]; then
  say "loading images into kind"
  kind load docker-image --name "$CLUSTER" "orchard/sandbox-service:$TAG" "orchard/agent-injector:$TAG" \
    "orchard/mlflow:$TAG" "$TASK_IMAGE"
  OVERLAY=manifests/overlays/dev
else
  : "${REGISTRY:?set REGISTRY to push images when NO_KIND=1}"
  say "pushing images to $REGISTRY"
  for image in sandbox-service agent-injector mlflow; do
    docker tag "orchard/$image:$TAG" "$REGISTRY/$image:$TAG" && docker push -q "$REGISTRY/$image:$TAG"
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

say "applying $OVERLAY"
kubectl apply -k "$OVERLAY"
kubectl -n "$NAMESPACE" rollout status deploy/orchard-sandbox-service --timeout=180s

secret=$(kubectl -n "$NAMESPACE" get deploy orchard-sandbox-service \
  -o jsonpath='{.spec.template.spec.containers[0].env[?(@.name=="ORCHARD_TOKEN")].valueFrom.secretKeyRef.name}')
TOKEN=$(kubectl -n "$NAMESPACE" get secret "$secret" -o jsonpath='{.data.token}' | base64 -d)

kubectl -n "$NAMESPACE" port-forward svc/orchard-sandbox-service "$PORT:8765" >/tmp/orchard-port-forward.log 2>&1 &
PF=$!
trap 'kill $PF 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.2; done

say "exercising the REST API"
ORCHARD_URL="http://127.0.0.1:$PORT" ORCHARD_TOKEN="$TOKEN" TASK_IMAGE="$TASK_IMAGE" "$PY" - <<'EOF'
import os, time
from sandbox_service.client import SandboxClient
from sandbox_service.errors import BackendUnavailableError
from sandbox_service.models import SandboxCreate, NetworkPolicy

client = SandboxClient(os.environ["ORCHARD_URL"], os.environ["ORCHARD_TOKEN"], timeout=60)
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
  left=$(kubectl -n "$NAMESPACE" get pods,secrets,networkpolicies -l app.kubernetes.io/managed-by=orchard -o name)
  [ -z "$left" ] && break
  sleep 1
done
if [ -n "$left" ]; then echo "LEAKED:"; echo "$left"; exit 1; fi
say "smoke-k8s: all checks passed"
