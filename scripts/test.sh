#!/bin/sh
# test.sh runs every test: Go unit tests, the VM-booting integration tests
# (real QEMU microVMs; software emulation where KVM is missing), and the
# conformance suite with the real withruntime SDK and smolagents from PyPI.
# It installs what it needs first. The guest image is built once and cached
# in ~/.cache/emberbox, outside the clone.
set -eu
cd "$(dirname "$0")/.."

./scripts/deps.sh
make build
make vet

# Helm, for deploy/kubernetes's test (helm lint, helm template, and the
# committed manifests against a fresh render): built from the Go module
# proxy once, into a cache outside the clone.
helm_version=v3.22.0
tools=${XDG_CACHE_HOME:-$HOME/.cache}/emberbox-tools
if ! go version -m "$tools/helm" 2>/dev/null | grep -q "mod[[:space:]]*helm.sh/helm/v3[[:space:]]*$helm_version[[:space:]]"; then
	echo "== building helm $helm_version from the Go module proxy into $tools (once)"
	start=$(date +%s)
	GOBIN=$tools go install "helm.sh/helm/v3/cmd/helm@$helm_version"
	echo "helm built in $(($(date +%s) - start))s"
fi
export EMBERBOX_HELM="$tools/helm"

echo "== building the guest image (cached after the first build)"
./bin/emberbox image build

# The integration tests' cluster test runs the withruntime flow through
# the conformance suite too.
python3 -m pip install -q --disable-pip-version-check -r tests/conformance/requirements.txt

echo "== go test"
go test -count=1 -timeout 70m ./...
# sdk/go is its own module, which ./... does not enter.
(cd sdk/go && go test -count=1 ./...)

echo "== go test -race: the packages whose interleavings matter (no VMs)"
go test -race -short -count=1 ./internal/sandbox/ ./internal/store/ ./internal/api/ ./internal/guest/ ./internal/upload/ ./internal/egress/ ./internal/e2b/ ./internal/envd/ ./internal/interpreter/ ./internal/catalog/ ./internal/recipebuild/ ./internal/volumes/ ./internal/ociimport/ ./internal/cluster/ ./internal/webhook/ ./internal/secrets/ ./internal/computer/ ./internal/mcpgateway/ ./internal/liveview/

echo "== fuzz: every fuzz target briefly (crashers found earlier run above as test cases)"
./scripts/fuzz.sh 5

echo "== conformance: withruntime SDK and smolagents against a live server"
python3 -m pytest -q tests/conformance

echo "== Python SDK (sdk/python): unit tests, then live tests with smolagents and withruntime"
python3 -m pip install -q --disable-pip-version-check "./sdk/python[test]"
python3 -m pytest -q sdk/python/tests
