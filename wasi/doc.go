// Package wasi is esf's WebAssembly backend: it runs WASI (preview 1)
// command modules with wazero against an attempt's root directory, the
// same overlay directory a runc container would get.
//
// # What a module sees
//
// "/" is Spec.Root, read-write: the module's writes land in the attempt's
// overlay delta and are sealed by suspend like any other. Spec.ExtraReadOnly
// adds read-only mounts. Paths resolve as under chroot, with
// openat2(RESOLVE_IN_ROOT): ".." stops at the top and symlinks, absolute
// ones included, resolve inside the mount. wazero's stock DirFS does not do
// this (it lets the host follow symlinks, so a guest-made "x ->
// ../../../etc" reaches the host's /etc, and an image's absolute links
// resolve against the host), which is why the mounts are ours (rootfs_linux.go);
// other platforms are refused with ErrUnsupported.
//
// ReadModule reads a module from a root the same confined way, for "exec
// ATTEMPT -- /path/in/root/tool.wasm": a symlink in the root cannot point
// the daemon at a host file or a device.
//
// WASI preview 1 reports a file's type, size, times, link count and symlink
// targets, but no permission bits, owner or device numbers: a Go program
// compiled for wasip1 sees 0600 for files and 0700 for directories, uid and
// gid 0, and a FIFO or socket as a file of unknown type. WASI has no mode
// argument and no chmod: files a guest creates are 0600 and directories
// 0700 (wazero's choice), less the daemon's umask, owned by the daemon's
// user.
//
// Clocks are the host's (wall and monotonic), random bytes come from
// crypto/rand, and sleeps are real but end early when the run's context
// ends. wazero's defaults are deterministic fakes; a sandbox that wants
// reproducible runs should not rely on those anyway, since file times are
// real.
//
// # Limits and stopping
//
// The context bounds a run: when it ends, the module is stopped at its next
// instruction (wazero's close-on-context-done) or when its sleep wakes, and
// Run returns an error wrapping ctx.Err(), which errdefs names
// deadline_exceeded. A module blocked inside a host call, reading stdin say,
// is woken only if the stream has deadlines (os.Pipe ends, net.Conn): Run
// sets one when the context ends.
//
// Memory is limited per run by a wazero memory allocator (see limiter), not
// by wazero's runtime-wide limit, so one compiled module serves every limit
// and a refused memory.grow is seen: a module that then fails is
// ErrQuotaExceeded. Linear memories are slices recycled, cleared, between
// runs (the clearing and copying of fresh ones was half a warm run's CPU).
// A module that traps reports TrapExitCode, not an error.
//
// # Caching and concurrency
//
// A Runtime is created once per daemon and is safe for concurrent runs.
// Modules are named by the BLAKE3 of their bytes (their CAS id) and
// compiled once: a bounded in-memory map of compiled modules (decoding a Go
// module again costs tens of milliseconds), over wazero's compilation cache
// in Options.CacheDir, which keeps machine code across restarts. Concurrent
// runs of a new module wait for one compile. Each run instantiates the
// compiled module anew: runs share nothing but the code.
//
// Nothing Run starts outlives it: the module is closed, its files and
// mounts released, and the helpers watching the context are stopped
// before it returns.
package wasi
