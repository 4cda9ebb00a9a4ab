#!/usr/bin/env bash
# Installs the Debian packages esf's tests and daemon need, only when one is
# missing: a warm machine never touches apt. Needs root to install; without
# root it only reports what is missing, so non-root test runs still work (the
# tests that need these tools skip with a message).
set -euo pipefail

# What each package is for:
#   runc            executor/ (issue 4): the OCI runtime the daemon drives
#   fuse3           fusefs/: fusermount3 and the FUSE userspace config
#   busybox-static  a static rootfs for container and WASI fixtures
#   attr            getfattr/setfattr for the xattr round-trip checks
#   tar             import/export cross-checks against GNU tar
#   git             bench/ and fixtures that clone small repositories
#   e2fsprogs       chattr/lsattr and filesystem images in later tests
#   zstd, gzip      compressed tar fixtures for import tests
#   diffutils       diff -r in the end-to-end tests
#   python3         the Python client's suite (e2e TestPython_Client)
#   mypy            make lint: mypy --strict clients/python
#   python3-venv, python3-pip  the Python client's packaging test: pip install into a venv, offline
#   btrfs-progs     delta/: the disk pool that limits attempts' deltas (mkfs.btrfs, btrfs quota)
#   chromium        e2e TestUI_Browser: the web view (esfctl ui) driven headless
#   bash-static     e2b/: the /bin/bash the E2B SDKs run commands with, in the acceptance rootfs
#   nodejs, npm     e2e/e2bsdk: the unmodified E2B JavaScript SDK drives the front door (only when
#                   no npm is on PATH: a node from elsewhere, e.g. NodeSource, brings its own)
packages=(runc fuse3 busybox-static attr tar git e2fsprogs zstd gzip diffutils python3 python3-venv python3-pip mypy btrfs-progs bash-static chromium)

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
if ! command -v npm >/dev/null 2>&1; then
	missing+=(nodejs npm)
fi

if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing ${missing[*]} (not root: not installing; tests that need them will skip)" >&2
	exit 0
fi

# One installer at a time: several make runs on one machine share dpkg's lock.
exec 9>/var/lock/esf-deps.lock
flock 9

echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
