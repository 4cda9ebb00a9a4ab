// Package testenv says whether the real components a test needs are here.
//
// Tests that prove a requirement with real components (a FUSE mount,
// overlayfs, runc containers) cannot run everywhere: a developer's laptop
// may lack root or /dev/fuse. There such a test skips with the reason. CI
// has all of them, and a test that skipped there would prove nothing while
// looking green, so CI sets ESF_TEST_REQUIRE=all and a missing capability
// fails the test instead.
//
// ESF_TEST_REQUIRE is "all" or a comma-separated list of capability names
// (root, fuse, overlay, runc, busybox, etcd, s3, or cmd:NAME for a program on
// PATH); a listed capability that is missing fails the test, any other
// skips it.
//
// Checks run once per process and are safe for concurrent use. The package
// also holds the few helpers that set real components up for tests
// (ReadOnlyBind).
package testenv
