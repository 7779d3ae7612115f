#!/usr/bin/env bash
# The OCR service on KubeRay, in one namespace, in order:
#
#   bash deploy/kuberay/install.sh NAMESPACE IMAGE      # e.g. ocr ghcr.io/you/ocr-serve:0.1.0
#
# 1. the namespace; 2. the Secrets the manifests read (ocr-auth-token: the
# service's bearer token; ocr-redis: one Redis password, and the job book's
# URL built from it), each created only if missing, so a rerun keeps the
# tokens clients already hold; 3. the two Redis servers (deploy/kuberay/redis.yaml),
# waited for; 4. the RayService (deploy/kuberay/rayservice.yaml, or the file
# in RAYSERVICE=...) with IMAGE (your build of deploy/docker/Dockerfile) in
# place of the placeholder.
# Needs kubectl (pointed at the cluster, with the KubeRay operator >= v1.5.1
# installed) and openssl. Every kubectl call names the namespace: nothing
# lands in the context's default. tests/unit/test_deploy_manifests.py runs
# this script against a stand-in kubectl; it has not been run on a cluster.
set -euo pipefail
NS=${1:?usage: install.sh NAMESPACE IMAGE (e.g. ocr ghcr.io/you/ocr-serve:0.1.0)}
IMAGE=${2:?usage: install.sh NAMESPACE IMAGE: IMAGE is your build of deploy/docker/Dockerfile, pushed}
HERE="$(cd "$(dirname "$0")" && pwd)"
RAYSERVICE=${RAYSERVICE:-$HERE/rayservice.yaml}
PLACEHOLDER=ghcr.io/example/ocr-serve:0.1.0
k() { kubectl --namespace "$NS" "$@"; }

if ! kubectl get namespace "$NS" >/dev/null 2>&1; then
  kubectl create namespace "$NS"
fi
if ! k get secret ocr-auth-token >/dev/null 2>&1; then
  k create secret generic ocr-auth-token --from-literal=token="$(openssl rand -hex 32)"
  echo "service token: kubectl --namespace $NS get secret ocr-auth-token -o jsonpath='{.data.token}' | base64 -d"
fi
if ! k get secret ocr-redis >/dev/null 2>&1; then
  P=$(openssl rand -hex 32)
  k create secret generic ocr-redis --from-literal=password="$P" --from-literal=url="redis://:$P@ocr-redis:6379/1"
fi
k apply -f "$HERE/redis.yaml"
k rollout status statefulset/ocr-gcs-redis --timeout=300s
k rollout status statefulset/ocr-redis --timeout=300s
sed "s#$PLACEHOLDER#$IMAGE#g" "$RAYSERVICE" | k apply -f -
echo "watch it: kubectl --namespace $NS get rayservice ocr -w"
