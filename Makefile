# Causeway build. `make test` is what CI runs (see .ci/run).
GO        ?= go
BIN       ?= bin
GOBIN_DIR ?= $(shell $(GO) env GOPATH)/bin
PROTOC_GEN_GO_VERSION := v1.36.12
# Go tests need root for network namespaces; they skip those cases otherwise.
TEST_FLAGS ?= -count=1 -timeout 14m

BINARIES := controlplane nodeproxy waypoint meshctl echo
# One image per command that runs in a cluster; echo is the sample's and the
# e2e's workload. meshctl runs on the operator's machine: no image.
IMAGES := controlplane nodeproxy waypoint causeway-agent causeway-cni echo

# The version every binary and image reports (pkg/version); a release sets
# VERSION=vX.Y.Z. REVISION and CREATED come from the commit, never the
# clock, so two builds of one commit give the same image digests.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
TAG      ?= $(VERSION)
REVISION := $(shell git rev-parse HEAD 2>/dev/null)
CREATED  := $(shell git log -1 --format=%cI HEAD 2>/dev/null || echo 1970-01-01T00:00:00Z)
SOURCE   := https://github.com/causeway-mesh/causeway
LDFLAGS  := -X github.com/causeway-mesh/causeway/pkg/version.version=$(VERSION) \
	-X github.com/causeway-mesh/causeway/pkg/version.revision=$(REVISION)
# The CNCF distribution registry hack/images' tests push to (hack/cluster/build.sh registry).
# make test's Kubernetes e2e runs on three real nodes (NODES=1 for quick work).
TEST_NODES ?= 3
REGISTRY_TOOL = $(shell bash -c '. hack/cluster/lib.sh && echo $$REGISTRY_BIN/registry')

.PHONY: all build test lint proto demo bench fuzz bench-k8s faults faults-k8s clean cluster cluster-down images e2e-k8s conformance push release release-version chart manifests chart-release

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ $(addprefix ./cmd/,$(BINARIES))

# Builds every image for linux/amd64 and linux/arm64 and pushes it to
# REGISTRY (HOST[:PORT][/PATH]) as REGISTRY/<image>:TAG, with the docker
# config file's credentials (`docker login`); prints each REF@DIGEST and
# writes them to $(BIN)/images.txt. REGISTRY_CA: PEM roots for a registry
# with a private CA.
PUSH_FLAGS = -registry "$(REGISTRY)" -tag "$(TAG)" -version "$(VERSION)" -revision "$(REVISION)" \
	-created "$(CREATED)" -source "$(SOURCE)" $(if $(REGISTRY_CA),-registry-ca "$(REGISTRY_CA)")
push:
	@test -n "$(REGISTRY)" || { echo "usage: make push REGISTRY=host[:port][/path] [TAG=...]"; exit 2; }
	@mkdir -p $(BIN)
	$(GO) run ./hack/images push $(PUSH_FLAGS) -refs $(BIN)/images.txt $(addprefix ./cmd/,$(IMAGES))

# A release: the images pushed as REGISTRY/<image>:VERSION, and dist/ with
# install.yaml pinning them by digest (checked against the registry) and
# sha256sums (hack/release.sh).
release: release-version push
	GO=$(GO) VERSION="$(VERSION)" REFS=$(BIN)/images.txt REGISTRY_CA="$(REGISTRY_CA)" hack/release.sh

release-version:
	@echo "$(VERSION)" | grep -Eq '^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$$' || \
		{ echo "usage: make release VERSION=vX.Y.Z REGISTRY=host[:port][/path] (VERSION is '$(VERSION)')"; exit 2; }
	@test "$(TAG)" = "$(VERSION)" || { echo "make release: TAG must be VERSION"; exit 2; }

# Every fuzz target runs for TEST_FUZZTIME in `make test` (its seeds, in
# testdata/fuzz and f.Add, also run in the plain `go test`), and for
# FUZZTIME in `make fuzz`.
TEST_FUZZTIME ?= 10s
FUZZTIME      ?= 3m

# Unit and loopback tests, every fuzz target briefly, then the cluster tests
# (skipped, saying so, without root).
test: lint build chart
	hack/cluster/build.sh registry
	CAUSEWAY_HELM=$$(hack/chart/helm.sh) CAUSEWAY_REGISTRY_BIN=$(REGISTRY_TOOL) $(GO) test $(TEST_FLAGS) ./...
	GO=$(GO) FUZZTIME=$(TEST_FUZZTIME) ./hack/fuzz.sh
	$(GO) run ./bench/faults -bin $(BIN) -base-port $(FAULTS_BASE_PORT) -only '^(controlplane-kill|policy-edit)$$' -row 8s
	NODES=$${NODES:-$(TEST_NODES)} hack/cluster/e2e.sh

fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) ./hack/fuzz.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run ./hack/filedeps -check pkg/l7

# The Helm chart (charts/causeway), the one source of the install: strict
# lint, a render, and the check that what `make manifests` generates from it
# (manifests/core, the Gateway API CRDs) is
# what is committed. Helm is built once from the module proxy (hack/chart/helm.sh).
chart:
	@helm=$$(hack/chart/helm.sh) && set -x && \
	$$helm lint --strict charts/causeway --namespace causeway-system && \
	$$helm template causeway charts/causeway --namespace causeway-system >/dev/null && \
	$(GO) run ./hack/manifests -helm $$helm -check

manifests:
	helm=$$(hack/chart/helm.sh) && $(GO) run ./hack/manifests -helm $$helm

# The chart packaged and rendered for a release (hack/chart/release.sh):
# VERSION=vX.Y.Z, RELEASE_VALUES=<values file with the registry and digests>.
DIST ?= dist
chart-release:
	hack/chart/release.sh $(VERSION) $(RELEASE_VALUES) $(DIST)

# Regenerates the committed protobuf code with pinned generators.
proto:
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	PATH=$(GOBIN_DIR):$$PATH protoc -I pkg/xds/meshv1 -I /usr/include \
		--go_out=paths=source_relative:pkg/xds/meshv1 pkg/xds/meshv1/mesh.proto

# A whole local mesh on loopback, a scripted tour, then everything stops.
# Its admin, status and SOCKS5 listeners take 127.0.0.1 ports from BASE_PORT.
BASE_PORT ?= 16000
demo: build
	$(BIN)/meshctl demo --bin $(BIN) --state .causeway-demo --base-port $(BASE_PORT) examples/local

bench: build
	./bench/run.sh

# What the mesh adds to a request on the test cluster (bench/README.md
# "Latency on Kubernetes"): about 12 minutes; needs root; uses the running
# cluster or brings one up for the run and removes it.
# BENCH_K8S_FLAGS: e.g. -t 10s -after 0 (a quick run), -rates 1000 -keep.
BENCH_K8S_FLAGS ?=
bench-k8s:
	bench/latency-k8s.sh $(BENCH_K8S_FLAGS)

# The Kubernetes test cluster (root; see README "Kubernetes test cluster"):
# one node, or NODES=3 for three (docs/cluster.md); e2e-k8s and bench-k8s
# take NODES too when they bring the cluster up.
cluster:
	hack/cluster/up.sh

cluster-down:
	hack/cluster/down.sh

images:
	hack/cluster/images.sh all

# Against the running cluster, or one brought up and removed for the run.
e2e-k8s:
	hack/cluster/e2e.sh

# The official Gateway API conformance suite (go.mod's version, unmodified)
# against manifests/ on the test cluster, as e2e-k8s brings it up; writes
# the ConformanceReports to REPORT (the MESH profiles; default
# bin/conformance/report.yaml) and GATEWAY_REPORT (the GATEWAY profiles;
# default bin/conformance/gateway-report.yaml).
# conformance/reports/ holds the published ones (its README says how).
conformance:
	hack/cluster/conformance.sh

# Faults under load (bench/README.md "Faults"): every row, about 5 minutes.
# FAULTS_FLAGS: e.g. -row 30s -rate 50 -only policy -keep.
FAULTS_BASE_PORT ?= 21000
FAULTS_FLAGS     ?=
faults: build
	$(GO) run ./bench/faults -bin $(BIN) -base-port $(FAULTS_BASE_PORT) $(FAULTS_FLAGS)

# The same faults on the running test cluster (bench/README.md "Faults on
# Kubernetes"), 6 to 8 minutes; needs root and `make cluster` first.
# FAULTS_K8S_FLAGS: e.g. -row 30s -only waypoint -keep.
FAULTS_K8S_FLAGS ?=
faults-k8s:
	bench/faults-k8s.sh $(FAULTS_K8S_FLAGS)

clean:
	rm -rf $(BIN)
