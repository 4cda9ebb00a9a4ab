#!/usr/bin/env bash
# Prints the path of the pinned versitygw binary (an Apache-2.0 S3 gateway in
# Go with a posix backend), installing it first if the tools cache does not
# have it yet (scripts/toolcache.sh). The tests of cas/s3 and of esfd
# --cas-remote start it on loopback with a temp directory (internal/s3test).
#
# Why versitygw: a real S3 implementation, not a fake, that honours
# conditional PUTs (If-None-Match: * answers 412); Debian has no usable S3
# server. `go install` takes about 4 minutes cold on 2 cores.
set -euo pipefail
. "$(dirname "$0")/toolcache.sh"

version=v1.8.0
go=${GO:-go}

build() {
	CGO_ENABLED=0 GOBIN="$1" "$go" install -trimpath -ldflags '-s -w' \
		"github.com/versity/versitygw/cmd/versitygw@$version" >&2
}

toolcache versitygw "$version" build
