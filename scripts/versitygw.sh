#!/usr/bin/env bash
# Prints the path of the pinned versitygw binary (an Apache-2.0 S3 gateway in
# Go with a posix backend), installing it first if the tools cache does not
# have it yet. The tests of cas/s3 and of esfd --cas-remote start it on
# loopback with a temp directory (internal/s3test).
#
# Why versitygw: a real S3 implementation, not a fake, that honours
# conditional PUTs (If-None-Match: * answers 412); Debian has no usable S3
# server. `go install` takes about 4 minutes cold on 2 cores; the result is
# cached under $ESF_TOOLS (default /var/cache/esf-tools) keyed by version, so
# later runs on the same machine take no time.
set -euo pipefail

version=v1.8.0
cache=${ESF_TOOLS:-/var/cache/esf-tools}
dir=$cache/versitygw-$version
bin=$dir/versitygw

if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi
mkdir -p "$cache"
# One builder at a time: parallel make runs on one machine share the cache.
exec 9>"$cache/.versitygw-$version.lock"
flock 9
if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi

go=${GO:-go}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "versitygw: installing github.com/versity/versitygw/cmd/versitygw@$version into $dir (once per machine)" >&2
CGO_ENABLED=0 GOBIN="$work" "$go" install -trimpath -ldflags '-s -w' \
	"github.com/versity/versitygw/cmd/versitygw@$version" >&2
mkdir -p "$dir"
mv "$work/versitygw" "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "$bin"
