// Package executor is the seam between fabric and the thing that runs
// untrusted commands inside an attempt's writable root. The OCI/Linux
// implementation (runc, through containerd's go-runc) lives in
// executor/runc; the static init every container runs as its PID 1 lives in
// executor/init.
//
// The contract is one container per attempt, named by an id the caller
// chooses (fabric uses the attempt id):
//
//	Start   create and start the container on a directory (the overlay root)
//	Exec    run a process in it; stdout and stderr stream as produced, stdin
//	        is a pipe the caller writes, a PTY is optional and resizable; the
//	        context's end kills the process and everything it started
//	Freeze  stop every process (cgroup freezer) so a seal sees a still tree
//	Thaw    let them run again
//	Stop    kill everything and delete the container; no leftovers
//	List    what exists, so a restarted daemon can adopt or delete it
//
// Implementations keep no state that a restart loses: everything they need
// to find, exec into, freeze or stop a container is on disk under their
// state dir, so a container started by one daemon process is adopted by the
// next by simply using its id. Stop is idempotent and also removes the
// remains of a start that crashed half way.
//
// Footprint: the container needs mountpoints for /proc, /dev, /sys, /run and
// the init at /.esf/init. A runtime creates the ones the image lacks inside
// the rootfs, that is inside the attempt's writable delta. Nothing the
// sandbox does can change what lies under a mountpoint, so a seal taken
// while the container runs must skip those paths (Footprint, or
// Spec.Footprint with the extra mounts); Stop removes the ones it created
// when they are still empty, leaving the rootfs as the sandbox left it.
//
// Concurrency: an Executor is safe for concurrent use. Execs into one
// container run concurrently; Start, Freeze, Thaw and Stop of one id are
// serialised by the implementation.
package executor
