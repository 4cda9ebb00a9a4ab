#!/usr/bin/env bash
# Prints the path of the pinned etcd server binary, building it first if the
# tools cache does not have it yet. The journal's etcd tests, the crash
# harness and bench/ start it on loopback (internal/etcdtest).
#
# Why built here: Debian's etcd-server is 3.4 (end of life), and the server
# module has replace directives, so `go install` refuses it: it is built
# inside a throwaway module instead (about 3 minutes cold on 2 cores). The
# result is cached under $ESF_TOOLS (default /var/cache/esf-tools) keyed by
# version, so later runs on the same machine take no time.
set -euo pipefail

version=v3.7.3
cache=${ESF_TOOLS:-/var/cache/esf-tools}
dir=$cache/etcd-$version
bin=$dir/etcd

if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi
mkdir -p "$cache"
# One builder at a time: parallel make runs on one machine share the cache.
exec 9>"$cache/.etcd-$version.lock"
flock 9
if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi

go=${GO:-go}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "etcd: building go.etcd.io/etcd/server/v3@$version into $dir (once per machine)" >&2
(
	cd "$work"
	"$go" mod init esf.tools/etcd >/dev/null 2>&1
	"$go" get "go.etcd.io/etcd/server/v3@$version" >&2
	CGO_ENABLED=0 "$go" build -trimpath -ldflags '-s -w' -o "$work/etcd" go.etcd.io/etcd/server/v3 >&2
)
"$work/etcd" --version >&2
mkdir -p "$dir"
mv "$work/etcd" "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "$bin"
