#!/bin/sh
# Prints the Secret `maskgate-api-keys` that every overlay reads its keys from, with fresh
# random keys (32 random bytes each, hex), as YAML on stdout; nothing is sent to a cluster:
#
#   kubectl create namespace maskgate
#   deploy/k8s/create-secret.sh | kubectl apply -f -
#
# Usage: create-secret.sh [NAMESPACE]   (default: maskgate)
# Environment, to keep keys you already have instead of new ones:
#   UPSTREAM_API_KEY, UPSTREAM_ADMIN_API_KEY   keys your upstream servers were started with
#                                              (external-upstreams: SGLang / vLLM --api-key)
#
# Keys in the Secret (docs/deploy.md, "Keys"):
#   api-keys                YAML list of client keys (gateway: api_keys)
#   admin-key               the gateway's admin key: control plane and admin API
#   upstream-api-key        workers' --api-key; the gateway sends it upstream
#   upstream-admin-api-key  workers' --admin-api-key; the gateway sends it on control fan-out
# The keys travel through a file readable only by you (never on a command line), removed on exit.
set -eu

namespace="${1:-maskgate}"
key() { od -An -tx1 -N32 /dev/urandom | tr -d ' \n'; }

dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
trap 'exit 130' INT TERM
umask 077
{
    printf 'api-keys=["%s"]\n' "$(key)"
    printf 'admin-key=%s\n' "$(key)"
    printf 'upstream-api-key=%s\n' "${UPSTREAM_API_KEY:-$(key)}"
    printf 'upstream-admin-api-key=%s\n' "${UPSTREAM_ADMIN_API_KEY:-$(key)}"
} >"$dir/keys.env"

kubectl create secret generic maskgate-api-keys \
    --namespace "$namespace" \
    --from-env-file="$dir/keys.env" \
    --dry-run=client --output=yaml
