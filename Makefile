# gpuplane — build, test and generate.
GO        ?= go
BIN       ?= bin/gpuplane
GOBIN_DIR ?= $(shell $(GO) env GOPATH)/bin
export CGO_ENABLED := 1
export CGO_CFLAGS  := -Wno-deprecated-declarations
PKGS      := ./...
TEST_TIMEOUT ?= 15m

BUF_VERSION            := v1.75.0
PROTOC_GEN_GO_VERSION  := v1.36.12
CONNECT_GO_VERSION     := v1.21.1
STATICCHECK_VERSION    := v0.8.2

.PHONY: all build test test-short generate check-generate tools lint bench clean docs

all: build

build:
	$(GO) build -o $(BIN) ./cmd/gpuplane

# The README's test command: unit, integration and CLI tests, all in-process or
# over loopback, with the race detector off to stay near ten minutes on 2 cores.
test:
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

test-race:
	$(GO) test -race -count=1 -timeout 30m $(PKGS)

# Regenerates docs/cli, the CLI reference, from the commands' own help;
# TestCLIReferenceIsCurrent fails when it is stale.
docs:
	$(GO) test -count=1 -run TestCLIReferenceIsCurrent ./cmd/gpuplane/cli/ -args -update-docs

tools:
	GOBIN=$(GOBIN_DIR) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	GOBIN=$(GOBIN_DIR) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(GOBIN_DIR) $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@$(CONNECT_GO_VERSION)

generate:
	PATH="$(GOBIN_DIR):$$PATH" buf generate

# Fails when the committed generated code differs from what buf generates now.
check-generate: generate
	@git diff --exit-code -- proto || (echo "generated code is stale: run 'make generate' and commit" >&2; exit 1)
	@test -z "$$(git status --porcelain -- proto)" || (git status --porcelain -- proto; echo "generated code is stale: run 'make generate' and commit" >&2; exit 1)

lint:
	$(GO) vet $(PKGS)
	@command -v staticcheck >/dev/null 2>&1 || GOBIN=$(GOBIN_DIR) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	PATH="$(GOBIN_DIR):$$PATH" staticcheck $(PKGS)

# Benchmarks: commit throughput and p50/p99 latency through the full RPC path
# against a real agent process and the data dir's fsync floor; the three-server
# cluster (failover, gossip convergence, throughput beside etcd when it is
# installed); the scheduler's placement rate; replay speed of a long log; the
# residency controller's decision latency and memory per model; the gateway
# queue's cost per request.
BENCH_FLAGS ?=
BENCH_CLUSTER_FLAGS ?=

.PHONY: bench-serve bench-commit bench-cluster bench-scheduler bench-packing bench-replay bench-soak bench-archive bench-residency bench-gateway bench-gateway-http bench-adapters bench-dashboard
bench: bench-commit bench-cluster bench-scheduler bench-replay bench-residency bench-gateway bench-gateway-http bench-adapters

bench-commit: build
	$(GO) run ./bench/commit -bin $(BIN) $(BENCH_FLAGS)

# bench/cluster is a module of its own (etcd's client stays out of go.mod).
bench-cluster: build
	cd bench/cluster && $(GO) run . -bin $(CURDIR)/$(BIN) $(BENCH_CLUSTER_FLAGS)

# simulate serve on every examples/serve config, all policies and the rate
# sweep; rewrites the tables in examples/serve/README.md.
bench-serve:
	$(GO) run ./bench/serve $(BENCH_SERVE_FLAGS)

bench-scheduler:
	GOMAXPROCS=2 $(GO) test -run '^$$' -bench . -benchtime 20000x ./cluster/scheduler/...
	GOMAXPROCS=2 $(GO) run ./bench/scheduler

# How the placement policies pack the whole openb family (24 pod lists ×
# both node lists, 10 seeds; CPU-heavy, about half an hour on 2 cores):
# GPUPLANE_OPENB_DIR names alibaba/clusterdata's
# cluster-trace-gpu-v2023/csv folder. Prints the markdown table.
BENCH_PACKING_FLAGS ?= -seeds 10
bench-packing:
	GOMAXPROCS=2 nice -n 10 $(GO) run ./bench/packing $(BENCH_PACKING_FLAGS)

bench-replay:
	$(GO) test -run '^$$' -bench Replay -benchtime 1x ./cluster/audit/

# Ten million entries through the state machine and its hash records with
# request ids expiring after 5 minutes of log time: request table, RSS and
# snapshot size per sample, and their slopes per million entries before the
# window fills and after. SOAK_ENTRIES runs fewer (it takes a while on a
# loaded machine).
SOAK_ENTRIES ?= 10000000
bench-soak:
	GOMAXPROCS=2 GPUPLANE_SOAK_ENTRIES=$(SOAK_ENTRIES) $(GO) test -run '^$$' -bench Soak -benchtime 1x -timeout 120m ./cluster/

# A server applies a million-entry log through Raft; the log is archived,
# compacted behind the archive, verified across both, replayed at an
# archived index, and an altered archived segment is named.
ARCHIVE_ENTRIES ?= 1000000
bench-archive:
	GOMAXPROCS=2 GPUPLANE_ARCHIVE_ENTRIES=$(ARCHIVE_ENTRIES) $(GO) test -run '^$$' -bench ArchiveCompact -benchtime 1x -timeout 60m ./cluster/

# 64 models on one card after an hour of virtual traffic: p50/p99/max of one
# Handle call (wall and thread CPU time), and the heap kept per managed model.
bench-residency:
	GOMAXPROCS=2 $(GO) test -run '^$$' -bench Decision64Models -benchtime 20000x ./node/residency/
	GOMAXPROCS=2 $(GO) test -run '^$$' -bench MemoryPerModel -benchtime 1x ./node/residency/

# Adapters hosted on one card at the interactive SLO (p95 TTFT <= 800 ms) on
# one base, against one replica per fine-tune, in virtual time with the real
# controller (issue 15).
bench-adapters:
	$(GO) test -run '^$$' -bench AdaptersPerCard -benchtime 1x -v ./node/residency/

# The gateway's queueing core on a busy card (64 deployments, 1,000 tenants,
# about 160 requests held per deployment): p50/p99 (wall and thread CPU) and
# allocations of one request's Enqueue plus one Finish that dispatches the next.
bench-gateway:
	GOMAXPROCS=2 $(GO) test -run '^$$' -bench EnqueueDispatch -benchtime 200000x ./node/gateway/queue/

# The dashboard in headless Chromium over a simulated cluster of 1,000
# replicas on 100 nodes: first render and refresh times (issue 20). Needs a
# chromium binary (Debian's chromium package); skips without one.
bench-dashboard:
	$(GO) test -run '^$$' -bench Dashboard -benchtime 1x -v ./rpc/

# The HTTP gateway on loopback against a sim engine and a plain reverse
# proxy (bench/RESULTS.md, Gateway HTTP).
bench-gateway-http: build
	GOMAXPROCS=2 $(GO) run ./bench/gateway -bin $(BIN) $(BENCH_GATEWAY_FLAGS)

# One dev agent, a pinned sim chat (--max-num-seqs 16), 120 background
# streams of one tenant against another's interactive requests: the
# interactive tenant's time to first token idle and under the flood
# (bench/RESULTS.md, Gateway admission under a flood).
.PHONY: bench-flood
bench-flood: build
	$(GO) run ./bench/flood -bin $(BIN) $(BENCH_FLOOD_FLAGS)

# Three servers and 1,000 hollow client nodes (bench/RESULTS.md, Fleet).
# Heavy: on a 2-core machine the fleet stops settling between 400 and 600
# nodes (gossip's own cost); BENCH_FLEET_FLAGS=-nodes 400 runs there.
.PHONY: bench-fleet
BENCH_FLEET_FLAGS ?=
bench-fleet: build
	$(GO) run ./bench/fleet -bin $(BIN) $(BENCH_FLEET_FLAGS)

clean:
	rm -rf bin

# Fault injection (jepsen/README.md): five real agents in network namespaces
# under partitions, kills, pauses, packet loss, Raft delay and membership
# changes, checked for linearizability and invariants. Needs root, ip and
# iptables; skips otherwise. JEPSEN_FLAGS passes e.g. -jepsen.seed N.
# JEPSEN_REQUEST_WINDOW is the servers' --request-window: short enough that
# request ids expire during the run (the request-window check requires it).
JEPSEN_FLAGS ?=
JEPSEN_REQUEST_WINDOW ?= 20s

# A full disk (needs root to mount small tmpfs; skips otherwise): the log
# store's rotation on a full disk, a single server's reads and refused
# writes, and the real binary filled, freed, killed (-9), stopped (SIGTERM)
# and restarted on a 64 MiB disk, audit verify --data-dir after each stop.
.PHONY: disk-faults
disk-faults:
	$(GO) test -count=1 -timeout 10m -v -run 'TestDiskFull|TestTailFill' ./cluster/raftstore ./cluster
	$(GO) test -count=1 -timeout 10m -v -run TestFullDiskRestarts ./cmd/gpuplane/e2e -e2e.disk-faults

.PHONY: jepsen jepsen-long jepsen-hollow
jepsen:
	$(GO) test -count=1 -timeout 10m -v ./jepsen -jepsen -jepsen.duration 2m -jepsen.request-window $(JEPSEN_REQUEST_WINDOW) $(JEPSEN_FLAGS)

jepsen-long:
	$(GO) test -count=1 -timeout 45m -v -run TestJepsen ./jepsen -jepsen -jepsen.duration 12m \
		-jepsen.workers 12 -jepsen.hold 15s -jepsen.quiet 3s -jepsen.stale-plans 200ms -jepsen.lin-timeout 10m $(JEPSEN_FLAGS)

# make jepsen with JEPSEN_HOLLOW hollow client nodes (gpuplane agent --hollow)
# in two processes of their own namespaces, which the nemesis partitions,
# kills and pauses too; they host the workload's replicas beside c4 and c5.
JEPSEN_HOLLOW ?= 8
jepsen-hollow:
	$(GO) test -count=1 -timeout 12m -v -run TestJepsen ./jepsen -jepsen -jepsen.duration 2m -jepsen.hollow $(JEPSEN_HOLLOW) \
		-jepsen.request-window $(JEPSEN_REQUEST_WINDOW) $(JEPSEN_FLAGS)

# Fuzz the descriptor parser, the command decoder (FuzzApplyBytes), the
# hand-written envelope decoder against proto.Unmarshal (FuzzDecoder) and the
# gateway's request parsing and limits (FuzzRequest) briefly. New inputs land
# in $(go env GOCACHE)/fuzz; copy them into testdata/fuzz to keep them.
# FUZZTIME is a count of executions per fuzzer (Nx), not a duration: with a
# duration, Go 1.26's fuzz coordinator can report "context deadline
# exceeded" as a failure when the time runs out (golang/go#75804, fixed in
# Go 1.27; it failed CI here once). About 30 s each on this 2-core machine.
FUZZTIME ?= 300000x
.PHONY: fuzz
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./fsm/descriptor/
	$(GO) test -run '^$$' -fuzz '^FuzzApplyBytes$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./fsm/
	$(GO) test -run '^$$' -fuzz '^FuzzDecoder$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./fsm/
	$(GO) test -run '^$$' -fuzz '^FuzzRequest$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./node/gateway/
