# esf — the daemon (esfd), the CLI (esfctl) and their tests.
#
#   make run    install missing system packages, build, start esfd in the foreground
#   make test   install missing system packages, go vet, go test -race over every package
#   make bench  the benchmark suite (bench/): ratios against baselines in the same run
#   make fuzz   every Fuzz target, a short run (FUZZTIME=10s) each

GO          ?= go
BIN         ?= bin
# Static binaries: esfd bind-mounts itself into containers later, and a
# static binary has no loader or libc to bring along.
CGO_ENABLED ?= 0
VERSION     ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X github.com/esf-dev/esf/fabric.Version=$(VERSION)
TEST_TIMEOUT ?= 30m
# Extra arguments for go test, e.g. make test TESTFLAGS='-run TestE2E -v'.
TESTFLAGS   ?=
# The remote-provider adapters are Go modules of their own (issue 10): the
# core never depends on them, and make test runs each one's suite too.
ADAPTERS    := $(patsubst %/go.mod,%,$(wildcard adapters/workspace/*/go.mod))

.PHONY: all build run test vet bench deps fmt lint clean fuzz

all: build

deps:
	./scripts/deps.sh

build:
	mkdir -p $(BIN)
	CGO_ENABLED=$(CGO_ENABLED) $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/esfd ./cmd/esfd
	CGO_ENABLED=$(CGO_ENABLED) $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/esfctl ./cmd/esfctl
	# The static init every container runs as PID 1 (esfd finds it beside itself).
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(BIN)/esf-init ./executor/init

# Foreground, embedded defaults: state in /var/lib/esf, socket
# /var/lib/esf/esfd.sock (ESF_STATE and ESF_SOCKET override them).
run: deps build
	./$(BIN)/esfd

vet:
	$(GO) vet ./...
	@for m in $(ADAPTERS); do echo "go vet $$m"; (cd $$m && $(GO) vet ./...) || exit 1; done

# -race needs cgo whatever CGO_ENABLED the binaries are built with.
# -count=1: e2e and crashtest build esfd/esfctl with `go build` in TestMain,
# which go test's result cache cannot see, so a cached pass could be stale.
# ESF_ETCD: the pinned etcd server the journal/etcd, crash and bench tests
# start on loopback (scripts/etcd.sh builds it once per machine).
# ESF_VERSITYGW: the pinned S3 server the content-tier tests start on
# loopback (scripts/versitygw.sh installs it once per machine).
# ESF_E2E_CAS_REMOTE=1: the end-to-end suite once more with every daemon's
# content on versitygw (esfd --cas-remote), the local store its cache.
# ESF_FABRIC_CAS_REMOTE=1: fabric's FR tests once more on a remote content
# store (versitygw behind the verified cache; about 3-4 minutes).
test: deps vet
	ESF_ETCD=$$(./scripts/etcd.sh) && export ESF_ETCD && \
	ESF_VERSITYGW=$$(./scripts/versitygw.sh) && export ESF_VERSITYGW && \
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./... && \
	ESF_E2E_CAS_REMOTE=1 CGO_ENABLED=1 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./e2e && \
	ESF_FABRIC_CAS_REMOTE=1 CGO_ENABLED=1 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) -run 'TestFR|TestCASRemoteSwitch' ./fabric
	@for m in $(ADAPTERS); do echo "go test $$m"; (cd $$m && CGO_ENABLED=1 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./...) || exit 1; done

# The benchmark suite of issue 8 (bench/doc.go): every scenario once, each
# against its baseline in the same run; prints the table and writes
# bench/results.json (bench-quick: bench/results-quick.json, < 5 min).
# Needs root. Extra flags: make bench BENCHARGS='-bench.run io -bench.profile out'.
bench: deps
	ESF_ETCD=$$(./scripts/etcd.sh) ESF_VERSITYGW=$$(./scripts/versitygw.sh) $(GO) test ./bench -run '^TestBench$$' -count=1 -v -timeout 150m -args -bench.full $(BENCHARGS)

bench-quick: deps
	ESF_ETCD=$$(./scripts/etcd.sh) ESF_VERSITYGW=$$(./scripts/versitygw.sh) $(GO) test ./bench -run '^TestBench$$' -count=1 -v -timeout 15m -args -bench.quick $(BENCHARGS)

# Every Fuzz target in the repository, FUZZTIME (10s) each: a short run
# that finds the shallow crashes; longer: make fuzz FUZZTIME=5m.
fuzz:
	./scripts/fuzz.sh

fmt:
	gofmt -l -w .

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@for m in $(ADAPTERS); do (cd $$m && $(GO) vet ./...) || exit 1; done
	@command -v mypy >/dev/null || { echo "mypy missing (make deps installs it)"; exit 1; }
	mypy --strict --python-version 3.9 clients/python

clean:
	rm -rf $(BIN)
