# Paths and addresses of the single-node test cluster: one definition, sourced by every script here.
# Everything the cluster writes lives under STATE and RUN (removed by cluster-down) or CACHE (kept:
# built binaries, image archives and containerd's image store, so a second cluster-up is fast;
# `make cluster-clean` removes it). Its network lives in one network namespace, NETNS, joined to the
# host by one veth pair; no route leads out of it.
CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$CLUSTER_DIR/versions.env"
CACHE="${ORCHARD_CLUSTER_CACHE:-/var/cache/orchard-cluster}"
STATE=/var/lib/orchard-cluster
RUN=/run/orchard-cluster
BIN="$CACHE/bin"
PKI="$STATE/pki"
LOGS="$STATE/logs"
NETNS=orchard-k8s
NETNS_PATH=/run/netns/$NETNS
HOST_IF=ok8s-host          # host end of the veth pair
NODE_IF=ok8s-node          # the node's end, inside NETNS
HOST_IP=10.250.0.1
NODE_IP=10.250.0.2         # the node and the API server (never loopback: pods reach it through a Service)
NODE_NAME=orchard-node
POD_CIDR=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16
API_SERVICE_IP=10.96.0.1
DNS_IP=10.96.0.10
CGROUP_ROOT=/orchard-cluster   # every pod's cgroup, under each v1 controller
CONTAINERD_SOCK="$RUN/containerd.sock"
KUBECONFIG_ADMIN="$STATE/admin.kubeconfig"
IMAGE_PREFIX=orchard-cluster   # images of the cluster's own add-ons: orchard-cluster/<name>:<version>
export PATH="$BIN:$PATH"
# Go's module and build caches of the cluster's programs live in the cache too: a cold build is one that
# starts from nothing (`make cluster-clean` drops them with the rest), and the host's own Go caches are
# left alone. -modcacherw: the module cache is removable with a plain rm.
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOFLAGS="-buildvcs=false -modcacherw"

in_netns() { nsenter --net="$NETNS_PATH" -- "$@"; }
kc() { kubectl --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
ctr_k8s() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }
say() { echo "[cluster $(date +%T)] $*" >&2; }
