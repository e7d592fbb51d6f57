#!/usr/bin/env bash
# `make cluster-up`: a single-node Kubernetes on this machine, no Docker. etcd, kube-apiserver,
# controller-manager, scheduler, kubelet, kube-proxy (iptables), kube-router's NetworkPolicy firewall
# and containerd (Debian's, with runc and the CNI bridge plugin) run as host processes inside network
# namespace $NETNS; CoreDNS, the local-path provisioner (default StorageClass) and Argo Workflows run as
# pods. Binaries come from build-binaries.sh's cache, images from images.sh. Prints each phase's time.
# Afterwards: export KUBECONFIG=/var/lib/orchard-cluster/admin.kubeconfig; `make cluster-down` undoes it all.
set -euo pipefail
source "$(dirname "$0")/env.sh"
[ "$(id -u)" = 0 ] || { echo "cluster-up: needs root (namespaces, mounts, cgroups)" >&2; exit 2; }
[ -e "$NETNS_PATH" ] && { echo "cluster-up: $NETNS exists: the cluster is up (make cluster-down first)" >&2; exit 2; }
t0=$SECONDS
phase() { say "$1 (${2:-$((SECONDS - t0))} s since start)"; }

"$CLUSTER_DIR/install-deps.sh"
"$CLUSTER_DIR/build-binaries.sh" >/dev/null
phase "binaries ready"
# The host state cluster-down must restore is recorded before anything changes.
[ -f "$CACHE/host-before" ] || "$CLUSTER_DIR/host-state.sh" > "$CACHE/host-before"
mkdir -p "$STATE" "$RUN" "$LOGS" "$RUN/pids"
"$CLUSTER_DIR/pki.sh"

# --- network: one namespace, one veth pair, no route out ---------------------------------------------
ip netns add "$NETNS"
ip link add "$HOST_IF" type veth peer name "$NODE_IF" netns "$NETNS"
ip addr add "$HOST_IP/30" dev "$HOST_IF"
ip link set "$HOST_IF" up
in_netns ip link set lo up
in_netns ip addr add "$NODE_IP/30" dev "$NODE_IF"
in_netns ip link set "$NODE_IF" up
# The kubelet and kube-proxy want a default route to pick the node's address; it leads only to the host
# end of the veth, and the host does not forward (its ip_forward is left as it was).
in_netns ip route add default via "$HOST_IP"
# Pods answer the host (the tests reach Services and pod IPs) but never open a connection out of the node.
in_netns iptables -I FORWARD -o "$NODE_IF" -m conntrack --ctstate NEW -j DROP
ip route add "$CLUSTER_CIDR" via "$NODE_IP" dev "$HOST_IF"
ip route add "$SERVICE_CIDR" via "$NODE_IP" dev "$HOST_IF"
in_netns sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1 \
  2>/dev/null || in_netns sysctl -qw net.ipv4.ip_forward=1

# start NAME CMD...: a host process inside the cluster's namespace, its own session, logged.
start() {
  local name="$1"; shift
  setsid nsenter --net="$NETNS_PATH" -- "$@" >"$LOGS/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN/pids/$name"
}
# wait_for WHAT SECONDS CMD...: poll until CMD succeeds, else print the component's log tail and fail.
wait_for() {
  local what="$1" limit="$2"; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "cluster-up: $what not ready after ${limit}s" >&2
      tail -n 30 "$LOGS/$what.log" >&2 2>/dev/null || true
      exit 1
    fi
    sleep 0.5
  done
}

# --- control plane --------------------------------------------------------------------------------
start etcd etcd --data-dir "$STATE/etcd" --listen-client-urls http://127.0.0.1:2379 \
  --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
  --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster default=http://127.0.0.1:2380 \
  --listen-metrics-urls http://127.0.0.1:2381 --log-level warn
wait_for etcd 60 in_netns etcdctl --endpoints http://127.0.0.1:2379 endpoint health
start kube-apiserver kube-apiserver --etcd-servers http://127.0.0.1:2379 \
  --advertise-address "$NODE_IP" --bind-address 0.0.0.0 --secure-port 6443 \
  --service-cluster-ip-range "$SERVICE_CIDR" --client-ca-file "$PKI/ca.crt" \
  --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction,ResourceQuota,PodSecurity \
  --allow-privileged=true --profiling=false --anonymous-auth=true --endpoint-reconciler-type lease
wait_for kube-apiserver 120 kc get --raw /readyz
phase "API server ready"
start kube-controller-manager kube-controller-manager --kubeconfig "$STATE/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$STATE/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$STATE/controller-manager.kubeconfig" \
  --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" --root-ca-file "$PKI/ca.crt" \
  --service-account-private-key-file "$PKI/sa.key" --use-service-account-credentials \
  --allocate-node-cidrs --cluster-cidr "$CLUSTER_CIDR" --node-cidr-mask-size 24 \
  --service-cluster-ip-range "$SERVICE_CIDR" --leader-elect=false --bind-address 127.0.0.1 --profiling=false
start kube-scheduler kube-scheduler --kubeconfig "$STATE/scheduler.kubeconfig" \
  --authentication-kubeconfig "$STATE/scheduler.kubeconfig" --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
  --leader-elect=false --bind-address 127.0.0.1 --profiling=false

# --- node: containerd, CNI, kubelet, kube-proxy, NetworkPolicy ---------------------------------------
mkdir -p "$STATE/cni" "$CACHE/containerd" "$STATE/kubelet" "$STATE/local-path" "$STATE/pod-logs"
cat > "$STATE/cni/10-orchard.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "orchard", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$RUN/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
cat > "$STATE/containerd.toml" <<TOML
version = 2
root = "$CACHE/containerd"
state = "$RUN/containerd"
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$RUN/containerd.sock.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/$IMAGE_PREFIX/pause:3.10"
  # No CAP_SYS_RESOURCE here: containerd may not lower a container's oom_score_adj below its own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni"
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd-opt"
TOML
start containerd containerd --config "$STATE/containerd.toml"
wait_for containerd 60 ctr --address "$CONTAINERD_SOCK" version
"$CLUSTER_DIR/images.sh" build
"$CLUSTER_DIR/images.sh" import
phase "images imported"

for ctl in /sys/fs/cgroup/*/; do
  [ -L "${ctl%/}" ] || mkdir -p "$ctl${CGROUP_ROOT#/}"
done
echo "nameserver $DNS_IP" > "$STATE/resolv.conf"
cat > "$STATE/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
# This machine kind has cgroup v1 (hybrid); kubelets from 1.35 refuse it unless told otherwise.
failCgroupV1: false
failSwapOn: false
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
resolvConf: $STATE/resolv.conf
podLogsDir: $STATE/pod-logs
maxPods: 250
serializeImagePulls: false
# Imported images are never pulled again: image GC must not delete them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%}
YAML
start kubelet kubelet --config "$STATE/kubelet.yaml" --kubeconfig "$STATE/kubelet.kubeconfig" \
  --root-dir "$STATE/kubelet" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v 1
cat > "$STATE/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $CLUSTER_CIDR
hostnameOverride: $NODE_NAME
# conntrack limits are host-wide sysctls: leave them alone.
conntrack: {maxPerCore: 0}
YAML
start kube-proxy kube-proxy --config "$STATE/kube-proxy.yaml"
wait_for kubelet 120 kc wait --for condition=Ready "node/$NODE_NAME" --timeout 2s
start kube-router kube-router --kubeconfig "$STATE/kube-router.kubeconfig" --hostname-override "$NODE_NAME" \
  --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
  --enable-pod-egress=false --metrics-port 0 --health-port 0
phase "node ready"

# --- add-ons: DNS, storage, Argo -------------------------------------------------------------------
"$CLUSTER_DIR/addons.sh"
phase "cluster up: export KUBECONFIG=$KUBECONFIG_ADMIN"
