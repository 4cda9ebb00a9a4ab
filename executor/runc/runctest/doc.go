// Package runctest holds the fixtures of the runc executor's tests and
// benchmarks: the preconditions check, the init binary built from source,
// and a minimal busybox-static rootfs with nothing of esf inside (FR-09).
// It is not used outside tests and benchmarks.
package runctest
