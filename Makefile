# Emberbox: `make build` builds both binaries into bin/; `make test` runs every
# test (VM-booting integration tests included); `make bench` measures; `make
# manifests` re-renders deploy/kubernetes/manifests from the chart; `make
# vet` runs go vet (in sdk/go, its own module, too), the house rules
# (internal/housekeeping: package docs, dependency fences, go vet for
# darwin, sizes) and gofmt.
GO      ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: build test test-short bench vet deps manifests clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/emberbox ./cmd/emberbox
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/emberbox-agent ./cmd/emberbox-agent

deps:
	./scripts/deps.sh

# The plain Kubernetes manifests, rendered from the Helm chart (needs helm).
manifests:
	./deploy/kubernetes/render.sh

vet:
	$(GO) vet ./...
	cd sdk/go && $(GO) vet ./...
	$(GO) test -count=1 ./internal/housekeeping/
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

test-short:
	$(GO) test -short ./...
	cd sdk/go && $(GO) test -short ./...

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./internal/integration/

clean:
	rm -rf bin
