#!/usr/bin/env bash
# Usage: build-binaries.sh [kubernetes|etcd|coredns|local-path-provisioner|kube-router|argo|training-operator ...]
# Build every Go program (or the named groups) of the single-node test cluster from the Go module proxy, once, into a cache
# keyed by versions.env. Prints the cache's bin/ directory on its last line. No Docker, no downloads of
# prebuilt binaries: containerd, runc and the CNI plugins come from Debian (install-cluster-deps.sh).
#   ORCHARD_CLUSTER_CACHE  cache root (default /var/cache/orchard-cluster)
set -euo pipefail
# shellcheck source=env.sh
source "$(dirname "$0")/env.sh"
cache_root="$CACHE"
bin="$BIN"
mkdir -p "$bin" "$cache_root/src"
export CGO_ENABLED=0
ldflags_base="-s -w"

stamp() { echo "[build $(date +%T)] $*" >&2; }

# have VERSION PROGRAM...: every program already built at that version (then linked into bin/).
have() {
  local version="$1" f; shift
  for f in "$@"; do [ -x "$cache_root/$f-$version/$f" ] || return 1; done
  for f in "$@"; do ln -sfn "$cache_root/$f-$version/$f" "$bin/$f"; done
}
# out VERSION PROGRAM: where a build of that program writes.
out() { mkdir -p "$cache_root/$2-$1"; echo "$cache_root/$2-$1/$2"; }

# A module that requires $1@$2 (and pins its own staging modules, for Kubernetes), so `go build` of
# the named packages resolves exactly the versions the project pins.
module_dir() {
  local dir="$cache_root/src/$1-$2"
  mkdir -p "$dir"
  echo "$dir"
}

build_kubernetes() {
  local cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
  have "$K8S_VERSION" "${cmds[@]}" && return
  local dir; dir="$(module_dir kubernetes "$K8S_VERSION")"
  local staging="v0.${K8S_VERSION#v1.}"
  (
    cd "$dir"
    [ -f go.mod ] || {
      go mod init orchard.local/cluster-k8s >/dev/null 2>&1
      # Kubernetes' go.mod replaces each k8s.io staging module with a directory of its own tree; a module
      # that requires it must pin each of them to the published v0.<minor>.<patch> instead.
      local gomod; gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
      grep -oE '^\s*k8s.io/[a-z0-9-]+ => ./staging' "$gomod" | awk '{print $1}' | while read -r m; do
        go mod edit -replace "$m=$m@$staging"
      done
      go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
      printf 'package tools\n\nimport (\n' > tools.go
      for c in "${cmds[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c" >> tools.go; done
      printf ')\n' >> tools.go
      sed -i '1i //go:build tools\n' tools.go
      go mod tidy -e >/dev/null 2>&1 || true
    }
    local v="$K8S_VERSION" minor; minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
    local ld="$ldflags_base"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld="$ld -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
      ld="$ld -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    for c in "${cmds[@]}"; do
      have "$K8S_VERSION" "$c" && continue
      stamp "kubernetes $K8S_VERSION: $c"
      local o; o="$(out "$K8S_VERSION" "$c")"
      go build -trimpath -ldflags "$ld" -o "$o.tmp" "k8s.io/kubernetes/cmd/$c"
      mv "$o.tmp" "$o"
    done
  )
  have "$K8S_VERSION" "${cmds[@]}"
}

# Build main package $2 of module $3@$4 into $bin/$1 through a module of our own that requires it:
# `go install pkg@version` refuses modules whose go.mod has replace directives (etcd, Argo), and a
# requiring module also lets us carry a replace the upstream module needs ($5..: "old=new@v").
build_main() {
  local name="$1" pkg="$2" module="$3" version="$4"; shift 4
  have "$version" "$name" && return
  local dir; dir="$(module_dir "$name" "$version")"
  stamp "$module@$version: $name"
  (
    cd "$dir"
    if [ ! -f go.mod ]; then
      go mod init "orchard.local/cluster-$name" >/dev/null 2>&1
      local r; for r in "$@"; do go mod edit -replace "$r"; done
      printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" > tools.go
      go get "$module@$version" >/dev/null 2>&1
      go mod tidy >/dev/null
    fi
    local o; o="$(out "$version" "$name")"
    go build -trimpath -ldflags "$ldflags_base" -o "$o.tmp" "$pkg"
    mv "$o.tmp" "$o"
  )
  have "$version" "$name"
}


all_args=("$@")
want_group() { [ ${#all_args[@]} -eq 0 ] || [[ " ${all_args[*]} " == *" $1 "* ]]; }

want_group kubernetes && build_kubernetes
want_group etcd && build_main etcd go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
want_group etcd && build_main etcdctl go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdctl/v3 "$ETCD_VERSION"
want_group coredns && build_main coredns github.com/coredns/coredns github.com/coredns/coredns "$COREDNS_VERSION"
want_group local-path-provisioner && build_main local-path-provisioner github.com/rancher/local-path-provisioner \
  github.com/rancher/local-path-provisioner "$LOCAL_PATH_VERSION"
want_group kube-router && build_main kube-router github.com/cloudnativelabs/kube-router/v2/cmd/kube-router \
  github.com/cloudnativelabs/kube-router/v2 "$KUBE_ROUTER_VERSION"
argo_replace=github.com/olekukonko/tablewriter=github.com/olekukonko/tablewriter@v0.0.5
want_group argo && build_main workflow-controller github.com/argoproj/argo-workflows/v3/cmd/workflow-controller \
  github.com/argoproj/argo-workflows/v3 "$ARGO_VERSION" "$argo_replace"
# The module proxy's zip of argo-workflows v3 lacks workflow/executor/osspecific/signal_linux.go (the
# repository has it; v3.5-v3.7 and v4 zips alike), so argoexec does not build for Linux from it. Build
# from a copy of the module whose Linux file is its own POSIX variant (signal_darwin.go: Kill by process
# group, Setpgid, reaping Wait), made in the cache, never committed.
argo_linux_source() {
  local src dst="$cache_root/src/argo-workflows-$ARGO_VERSION-linux"
  src=$(go mod download -json "github.com/argoproj/argo-workflows/v3@$ARGO_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  if [ ! -f "$dst/go.mod" ]; then
    rm -rf "$dst"; cp -r "$src" "$dst"; chmod -R u+w "$dst"
    local os="$dst/workflow/executor/osspecific"
    [ -f "$os/signal_linux.go" ] || cp "$os/signal_darwin.go" "$os/signal_linux.go"
  fi
  echo "$dst"
}
want_group argo && build_main argoexec github.com/argoproj/argo-workflows/v3/cmd/argoexec \
  github.com/argoproj/argo-workflows/v3 "$ARGO_VERSION" "$argo_replace" \
  "github.com/argoproj/argo-workflows/v3=$(argo_linux_source)"
# The Kubeflow Training Operator (PyTorchJob): its module has no replace directives, so it builds as
# `go install .../cmd/training-operator.v1@version` would, through a requiring module like the rest.
want_group training-operator && build_main training-operator github.com/kubeflow/training-operator/cmd/training-operator.v1 \
  github.com/kubeflow/training-operator "$TRAINING_OPERATOR_VERSION"
echo "$bin"
