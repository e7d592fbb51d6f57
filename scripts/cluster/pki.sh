#!/usr/bin/env bash
# The test cluster's certificates and kubeconfigs (openssl; ECDSA P-256), made once per cluster-up into
# $PKI: a CA, the API server's serving cert, one client cert per component (its user and groups are
# what RBAC and the Node authorizer check), the kubelet's serving cert and the service-account keys.
set -euo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$PKI"
cd "$PKI"
[ -f ca.crt ] || openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout ca.key \
  -out ca.crt -days 30 -subj "/CN=orchard-cluster-ca" 2>/dev/null

# cert NAME SUBJECT [SANS]: a key and a CA-signed cert; SANS like "DNS:a,IP:1.2.3.4" make it a server cert.
cert() {
  local name="$1" subj="$2" sans="${3:-}" ext
  [ -f "$name.crt" ] && return
  ext="$(mktemp)"
  if [ -n "$sans" ]; then
    printf 'keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' "$sans" > "$ext"
  else
    printf 'keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > "$ext"
  fi
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout "$name.key" -out "$name.csr" \
    -subj "$subj" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$name.crt" -days 30 \
    -extfile "$ext" 2>/dev/null
  rm -f "$name.csr" "$ext"
}

cert apiserver "/CN=kube-apiserver" \
  "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:$NODE_NAME,IP:$API_SERVICE_IP,IP:$NODE_IP,IP:127.0.0.1"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
cert admin "/O=system:masters/CN=orchard-admin"
cert controller-manager "/CN=system:kube-controller-manager"
cert scheduler "/CN=system:kube-scheduler"
cert kube-proxy "/CN=system:kube-proxy"
cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME"
cert kubelet-serving "/CN=$NODE_NAME" "DNS:$NODE_NAME,IP:$NODE_IP"
# kube-router reads policies, pods, namespaces and nodes cluster-wide (its ClusterRole is broad too).
cert kube-router "/O=system:masters/CN=kube-router"
[ -f sa.key ] || { openssl ecparam -name prime256v1 -genkey -noout -out sa.key; openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null; }

for who in admin controller-manager scheduler kube-proxy kubelet kube-router; do
  KUBECONFIG="$STATE/$who.kubeconfig" kubectl config set-cluster orchard --server "https://$NODE_IP:6443" \
    --certificate-authority "$PKI/ca.crt" --embed-certs >/dev/null
  KUBECONFIG="$STATE/$who.kubeconfig" kubectl config set-credentials "$who" --client-certificate "$PKI/$who.crt" \
    --client-key "$PKI/$who.key" --embed-certs >/dev/null
  KUBECONFIG="$STATE/$who.kubeconfig" kubectl config set-context orchard --cluster orchard --user "$who" >/dev/null
  KUBECONFIG="$STATE/$who.kubeconfig" kubectl config use-context orchard >/dev/null
done
chmod 600 "$PKI"/*.key "$STATE"/*.kubeconfig
