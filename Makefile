# Causeway build. `make test` is what CI runs (see .ci/run).
GO        ?= go
BIN       ?= bin
GOBIN_DIR ?= $(shell $(GO) env GOPATH)/bin
PROTOC_GEN_GO_VERSION := v1.36.12
# Go tests need root for network namespaces; they skip those cases otherwise.
TEST_FLAGS ?= -count=1 -timeout 14m

BINARIES := controlplane nodeproxy waypoint meshctl echo

.PHONY: all build test lint proto demo bench bench-k8s fuzz faults faults-k8s clean cluster cluster-down images e2e-k8s

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(BINARIES))

# Every fuzz target runs for TEST_FUZZTIME in `make test` (its seeds, in
# testdata/fuzz and f.Add, also run in the plain `go test`), and for
# FUZZTIME in `make fuzz`.
TEST_FUZZTIME ?= 10s
FUZZTIME      ?= 3m

# Unit and loopback tests, every fuzz target briefly, then the cluster tests
# (skipped, saying so, without root).
test: lint build
	$(GO) test $(TEST_FLAGS) ./...
	GO=$(GO) FUZZTIME=$(TEST_FUZZTIME) ./hack/fuzz.sh
	$(GO) run ./bench/faults -bin $(BIN) -base-port $(FAULTS_BASE_PORT) -only '^(controlplane-kill|policy-edit)$$' -row 8s
	hack/cluster/e2e.sh

fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) ./hack/fuzz.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run ./hack/filedeps -check pkg/l7

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

# The one-node Kubernetes test cluster (root; see README "Kubernetes test cluster").
cluster:
	hack/cluster/up.sh

cluster-down:
	hack/cluster/down.sh

images:
	hack/cluster/images.sh all

# Against the running cluster, or one brought up and removed for the run.
e2e-k8s:
	hack/cluster/e2e.sh

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
