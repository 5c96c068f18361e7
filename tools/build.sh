#!/usr/bin/env bash
# Builds the Go programs the cluster tests run (tools/README.md) from the wrapper modules in this
# folder into a cache outside the repository, and prints the folder holding them.
#
#   bash tools/build.sh            build what is missing; seconds when nothing changed
#   VLLM_PLATFORM_TOOLS_CACHE=DIR  where the builds go (default ~/.cache/vllm-platform/tools)
#
# Each wrapper is built into <cache>/<name>-<key>, where the key hashes everything that decides the
# build (go.mod, go.sum, our main.go, the link flags, the Go version); <cache>/bin links to the
# current build of each program. A build that fails names the wrapper and leaves the others built:
# the cluster tests say which program is missing and why (tests/cluster/README.md).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${VLLM_PLATFORM_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-platform/tools}"
mkdir -p "$cache/bin" "$cache/logs"
go_version="$(go env GOVERSION)"

# The version a wrapper's go.mod requires of a module (single-line or block form).
required() { sed -n "s#^\(require \)\{0,1\}[[:space:]]*$2 \(v[^ ]*\)\( // indirect\)\{0,1\}\$#\2#p" "$here/$1/go.mod"; }
kube_version="$(required kubernetes k8s.io/kubernetes)"
kube_minor="$(echo "$kube_version" | cut -d. -f2)"
pulumi_version="$(required pulumi github.com/pulumi/pulumi/pkg/v3)"
provider_module_version="$(required pulumi-kubernetes github.com/pulumi/pulumi-kubernetes/provider/v4)"
keda_version="$(required keda github.com/kedacore/keda/v2)"
karpenter_version="$(required karpenter-kwok sigs.k8s.io/karpenter)"
for value in "$kube_version" "$pulumi_version" "$provider_module_version" "$keda_version" "$karpenter_version"; do
  [ -n "$value" ] || { echo "tools: a pinned version could not be read from tools/*/go.mod" >&2; exit 1; }
done

# name | packages | link flags | files of the module copied beside our main (provider only)
ldflags_kubernetes="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version \
-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kube_minor \
-X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/client-go/pkg/version.gitVersion=$kube_version \
-X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$kube_minor"
ldflags_pulumi="-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$pulumi_version"
# The provider reports the module version it was built from (a pseudo-version), not a release number
# it is not: the engine is pointed at this binary by path (tests/cluster/pulumi_project.py).
ldflags_provider="-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=${provider_module_version#v}"
# KEDA's Makefile stamps the same variable (its operator logs it and reports it in keda_build_info).
ldflags_keda="-s -w -X github.com/kedacore/keda/v2/version.Version=$keda_version"
# Karpenter's operator logs and reports this variable (unset it says "unspecified").
ldflags_karpenter="-s -w -X sigs.k8s.io/karpenter/pkg/operator.Version=$karpenter_version"

build() {
  local name="$1" flags="$2"
  shift 2
  local src="$here/$name"
  local key
  key="$( (cat "$src/go.mod" "$src/go.sum" "$src"/*.go 2>/dev/null; echo "$flags" "$go_version" "$*") \
    | sha256sum | cut -c1-16)"
  local out="$cache/$name-$key"
  if [ -f "$out/.complete" ]; then
    echo "tools: $name up to date ($out)" >&2
  else
    echo "tools: building $name into $out (log: $cache/logs/$name.log)" >&2
    local work
    work="$(mktemp -d)"
    cp "$src/go.mod" "$src/go.sum" "$work/"
    cp "$src"/*.go "$work/" 2>/dev/null || true
    local started=$SECONDS
    if ! (
      cd "$work" || exit 1
      if [ "$name" = pulumi-kubernetes ]; then
        # The schema and Terraform mapping the provider serves, from the module itself: downloaded
        # (and checked against go.sum) first, since `go list -m` names no folder for a module that
        # is not in the module cache yet (a clean machine).
        go mod download github.com/pulumi/pulumi-kubernetes/provider/v4 || exit 1
        moddir="$(go list -m -f '{{.Dir}}' github.com/pulumi/pulumi-kubernetes/provider/v4)" || exit 1
        [ -n "$moddir" ] || { echo "no module folder for pulumi-kubernetes/provider/v4" >&2; exit 1; }
        cp "$moddir/cmd/pulumi-resource-kubernetes/schema.json" \
          "$moddir/cmd/pulumi-resource-kubernetes/terraform-mapping.json" . || exit 1
        chmod u+w schema.json terraform-mapping.json
        go build -trimpath -ldflags "$flags" -o "$out/bin/pulumi-resource-kubernetes" . || exit 1
      else
        go build -trimpath -ldflags "$flags" -o "$out/bin/" "$@" || exit 1
      fi
      # go build names a main package after its directory: etcd's is server, KEDA's is operator.
      if [ "$name" = etcd ]; then mv "$out/bin/server" "$out/bin/etcd" || exit 1; fi
      if [ "$name" = keda ]; then mv "$out/bin/operator" "$out/bin/keda-operator" || exit 1; fi
      # Karpenter's KWOK provider is a package named kwok: renamed so it cannot shadow KWOK itself.
      if [ "$name" = karpenter-kwok ]; then mv "$out/bin/kwok" "$out/bin/karpenter-kwok" || exit 1; fi
    ) >"$cache/logs/$name.log" 2>&1; then
      echo "tools: FAILED to build $name; the end of $cache/logs/$name.log:" >&2
      tail -n 15 "$cache/logs/$name.log" >&2
      rm -rf "$work"
      return 1
    fi
    rm -rf "$work"
    echo "$((SECONDS - started))" >"$out/.build-seconds"
    touch "$out/.complete"
    echo "tools: built $name in $((SECONDS - started)) s" >&2
    # Earlier builds of this wrapper (other keys) are not used any more.
    local old
    for old in "$cache/$name"-*; do
      [[ "$old" != "$out" && "$(basename "$old")" =~ ^$name-[0-9a-f]{16}$ ]] && rm -rf "$old"
    done
  fi
  local program
  for program in "$out"/bin/*; do ln -sfn "$program" "$cache/bin/$(basename "$program")"; done
}

status=0
build etcd "-s -w" go.etcd.io/etcd/server/v3 || status=1
build kwok "-s -w" sigs.k8s.io/kwok/cmd/kwok || status=1
build kubernetes "$ldflags_kubernetes" k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl || status=1
build argo-rollouts "-s -w" github.com/argoproj/argo-rollouts/cmd/rollouts-controller || status=1
build keda "$ldflags_keda" github.com/kedacore/keda/v2/cmd/operator || status=1
build pulumi-kubernetes "$ldflags_provider" || status=1
build pulumi "$ldflags_pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi || status=1
# Issue 41's Karpenter tests will run it; last, so that the programs today's tests need come first.
build karpenter-kwok "$ldflags_karpenter" sigs.k8s.io/karpenter/kwok || status=1
echo "$cache/bin"
exit "$status"
