# Sourced by the scripts that provide a pinned Go-built server to the tests
# (etcd.sh, versitygw.sh): one cache and one install protocol for all.
#
# toolcache NAME VERSION BUILD prints the path of NAME at VERSION under
# $ESF_TOOLS (default /var/cache/esf-tools), first running BUILD DIR, which
# must leave the binary at DIR/NAME, if the cache does not have it yet. One
# builder at a time (flock): parallel make runs on one machine share the
# cache. The binary appears under its final name only once it is whole.
toolcache() {
	local name=$1 version=$2 build=$3
	local cache=${ESF_TOOLS:-/var/cache/esf-tools}
	local dir=$cache/$name-$version
	local bin=$dir/$name
	if [ -x "$bin" ]; then
		echo "$bin"
		return 0
	fi
	mkdir -p "$cache"
	exec 9>"$cache/.$name-$version.lock"
	flock 9
	if [ -x "$bin" ]; then
		echo "$bin"
		return 0
	fi
	local work
	work=$(mktemp -d)
	trap 'rm -rf "'"$work"'"' EXIT
	echo "$name: building $version into $dir (once per machine)" >&2
	"$build" "$work"
	mkdir -p "$dir"
	mv "$work/$name" "$bin.tmp"
	mv "$bin.tmp" "$bin"
	echo "$bin"
}
