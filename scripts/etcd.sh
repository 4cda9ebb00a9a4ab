#!/usr/bin/env bash
# Prints the path of the pinned etcd server binary, building it first if the
# tools cache does not have it yet (scripts/toolcache.sh). The journal's etcd
# tests, the crash harness and bench/ start it on loopback (internal/etcdtest).
#
# Why built here: Debian's etcd-server is 3.4 (end of life), and the server
# module has replace directives, so `go install` refuses it: it is built
# inside a throwaway module instead (about 3 minutes cold on 2 cores).
set -euo pipefail
. "$(dirname "$0")/toolcache.sh"

version=v3.7.3
go=${GO:-go}

build() {
	(
		cd "$1"
		"$go" mod init esf.tools/etcd >/dev/null 2>&1
		"$go" get "go.etcd.io/etcd/server/v3@$version" >&2
		CGO_ENABLED=0 "$go" build -trimpath -ldflags '-s -w' -o "$1/etcd" go.etcd.io/etcd/server/v3 >&2
	)
	"$1/etcd" --version >&2
}

toolcache etcd "$version" build
