#!/bin/sh
# Runs every Fuzz target of the repository (the main module and each
# adapter module) for a short while: FUZZTIME each, 10s by default.
# go test -fuzz takes one target of one package at a time, so this lists
# them from the sources. New corpus entries found land in the package's
# testdata/fuzz/ (commit the ones that found a bug).
#
#   scripts/fuzz.sh            every target, 10s each
#   FUZZTIME=1m scripts/fuzz.sh
#   scripts/fuzz.sh ./api/...  only the packages under ./api
set -eu
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10s}
pattern=${1:-./...}
fail=0
run_module() { # $1: module directory
	(
		cd "$1"
		for pkg in $($GO list -f '{{.Dir}}' "$pattern" 2>/dev/null); do
			targets=$(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$pkg"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u)
			for t in $targets; do
				rel=./$(realpath --relative-to=. "$pkg")
				echo "fuzz $1 $rel $t ($FUZZTIME)"
				CGO_ENABLED=${CGO_ENABLED:-1} $GO test -run '^$' -fuzz "^$t\$" -fuzztime "$FUZZTIME" "$rel" || exit 1
			done
		done
	) || fail=1
}
run_module .
for m in adapters/workspace/*/; do
	[ -f "$m/go.mod" ] && run_module "${m%/}"
done
exit $fail
