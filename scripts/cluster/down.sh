#!/usr/bin/env bash
# `make cluster-down`: stop every process of the test cluster and undo what cluster-up did to the host
# (mounts, cgroups, the network namespace and its veth, routes, directories). Kept: $CACHE (binaries,
# image archives, containerd's image store; `make cluster-clean` removes it). Then compares the host with
# the state cluster-up recorded and exits 1, showing the difference, if anything is left.
set -uo pipefail
source "$(dirname "$0")/env.sh"

kill_pidfile() {
  local f="$RUN/pids/$1" pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  # setsid made each component a session leader: signal its whole session (nsenter and the program).
  pkill -TERM -s "$pid" 2>/dev/null || true
  for _ in $(seq 50); do pgrep -s "$pid" >/dev/null 2>&1 || break; sleep 0.1; done
  pkill -KILL -s "$pid" 2>/dev/null || true
  rm -f "$f"
}

# Every process left in the pods' cgroups (containers, whatever they forked): frozen, then killed.
kill_pod_processes() {
  local freezer="/sys/fs/cgroup/freezer${CGROUP_ROOT}" d
  [ -d "$freezer" ] && echo FROZEN > "$freezer/freezer.state" 2>/dev/null
  for d in /sys/fs/cgroup/*"${CGROUP_ROOT}"; do
    [ -d "$d" ] || continue
    find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  done
  [ -d "$freezer" ] && echo THAWED > "$freezer/freezer.state" 2>/dev/null
  sleep 0.2
}

for c in kube-router kube-proxy kubelet; do kill_pidfile "$c"; done
if [ -S "$CONTAINERD_SOCK" ]; then
  # Containers and their snapshots go, images stay (they live in the cache).
  for t in $(ctr_k8s tasks ls -q 2>/dev/null); do ctr_k8s tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
  kill_pod_processes
  for t in $(ctr_k8s tasks ls -q 2>/dev/null); do ctr_k8s tasks rm -f "$t" >/dev/null 2>&1; done
  ctr_k8s containers ls -q 2>/dev/null | xargs -r ctr --address "$CONTAINERD_SOCK" -n k8s.io containers rm >/dev/null 2>&1
fi
kill_pod_processes
kill_pidfile containerd
# The shims outlive containerd by design.
pkill -KILL -f "containerd-shim-runc-v2 -namespace k8s.io -address $CONTAINERD_SOCK" 2>/dev/null
for c in kube-scheduler kube-controller-manager kube-apiserver etcd; do kill_pidfile "$c"; done
sleep 0.3

# Mounts under the cluster's directories and the pods' network namespaces, deepest first.
before_netns=$(sed -n '/^## network namespaces/,/^## /p' "$CACHE/host-before" 2>/dev/null)
awk '{print $5}' /proc/self/mountinfo | while read -r m; do
  case "$m" in
    "$STATE"/*|"$RUN"/*|"$CACHE"/containerd/*|/run/containerd/*) echo "$m" ;;
    /run/netns/cni-*) grep -qx "${m#/run/netns/}" <<<"$before_netns" || echo "$m" ;;
  esac
done | sort -r | uniq | while read -r m; do umount -l "$m" 2>/dev/null || true; done
for f in /run/netns/cni-*; do
  [ -e "$f" ] || continue
  grep -qx "${f#/run/netns/}" <<<"$before_netns" || rm -f "$f"
done

# cgroups, leaves first.
for d in /sys/fs/cgroup/*"${CGROUP_ROOT}"; do
  [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
done

ip link del "$HOST_IF" 2>/dev/null   # its routes go with it
ip netns del "$NETNS" 2>/dev/null
# kubelet links each container's log into /var/log/containers; containerd's shims keep sockets in
# /run/containerd/s. Remove what points into our directories, and the directories if cluster-up made them.
# Paths the kubelet, containerd, libcni and `ip netns` use whatever they are told: the directory goes if
# cluster-up made it, else only what the cluster put there.
find /var/log/containers -maxdepth 1 -lname "$STATE/*" -delete 2>/dev/null
find /var/lib/cni/results -maxdepth 1 \( -name 'orchard-*' -o -name 'cni-loopback-*' \) -delete 2>/dev/null
for d in /var/log/containers /run/containerd/s /run/containerd /var/lib/kubelet /var/lib/cni; do
  grep -q "^$d: " "$CACHE/host-before" 2>/dev/null && continue
  [ -e "$d" ] || continue
  mountpoint -q "$d" && umount -l "$d"
  rm -rf "$d"
done
# /run/netns is anyone's `ip netns add` (which makes it again when needed): it goes only when empty, so
# another user's namespaces are never touched.
if [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ]; then
  mountpoint -q /run/netns && umount /run/netns
  rmdir /run/netns 2>/dev/null
fi
rm -rf "$STATE" "$RUN"

if [ -f "$CACHE/host-before" ]; then
  after=$("$CLUSTER_DIR/host-state.sh")
  if ! diff <(cat "$CACHE/host-before") <(echo "$after") > "$CACHE/host-diff"; then
    echo "cluster-down: the host differs from before cluster-up (< before, > now):" >&2
    cat "$CACHE/host-diff" >&2
    exit 1
  fi
  rm -f "$CACHE/host-before" "$CACHE/host-diff"
fi
say "cluster down; host as before cluster-up"
