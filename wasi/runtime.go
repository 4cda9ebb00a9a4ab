package wasi

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"

	"github.com/esf-dev/esf/cas"
)

// MaxMemoryLimitPages is the most a 32-bit WebAssembly memory can hold
// (4 GiB).
const MaxMemoryLimitPages = 65536

// MaxModuleSize bounds a module's binary (Spec.Module, ReadModule): the
// largest real modules (a Python interpreter, a compiler) are tens of MiB.
const MaxModuleSize = 512 << 20

// TrapExitCode is the exit code Run reports for a module that trapped
// (unreachable, out-of-bounds access, ...): 128+SIGABRT, as wasmtime does
// on Unix, so scripts see a crash rather than an exit the module chose.
const TrapExitCode = 134

// Options configure a Runtime. The zero value is usable.
type Options struct {
	// CacheDir keeps compiled machine code across restarts, keyed by the
	// module's hash and wazero's version (wazero's file cache). Empty:
	// compiled code lives in memory only.
	CacheDir string
	// MaxCompiled bounds the compiled modules kept in memory while no run
	// uses them; default 16. Each holds its machine code (a Go program:
	// about 10 MiB).
	MaxCompiled int
	// DefaultMemoryLimitPages applies when a Spec sets none; default
	// 16384 pages (1 GiB). At most MaxMemoryLimitPages.
	DefaultMemoryLimitPages uint32
	// MemoryBudget bounds the linear memory of all running modules
	// together, in bytes; 0: unbounded. A run takes its memory limit (at
	// most the whole budget) before it starts, queued in arrival order
	// until that fits; a declared minimum above the whole budget is
	// ErrQuotaExceeded at once, and a growth past what the run took
	// fails in the guest, as one beyond its own limit does. A run gives
	// it all back when it ends. A smaller Spec.MemoryLimitPages lets more
	// runs share the budget.
	MemoryBudget uint64
	// CompileWorkers compiles one module's functions in parallel; default
	// GOMAXPROCS.
	CompileWorkers int
	// Logger receives compile events; nil discards.
	Logger *slog.Logger
}

// Validate reports options that cannot work.
func (o *Options) Validate() error {
	if o.MaxCompiled < 0 {
		return fmt.Errorf("wasi options: max compiled %d: %w", o.MaxCompiled, ErrInvalidArgument)
	}
	if o.DefaultMemoryLimitPages > MaxMemoryLimitPages {
		return fmt.Errorf("wasi options: memory limit %d pages above %d: %w", o.DefaultMemoryLimitPages, MaxMemoryLimitPages, ErrInvalidArgument)
	}
	if o.CompileWorkers < 0 {
		return fmt.Errorf("wasi options: compile workers %d: %w", o.CompileWorkers, ErrInvalidArgument)
	}
	return nil
}

func (o Options) withDefaults() (Options, error) {
	if err := o.Validate(); err != nil {
		return o, err
	}
	if o.MaxCompiled == 0 {
		o.MaxCompiled = 16
	}
	if o.DefaultMemoryLimitPages == 0 {
		o.DefaultMemoryLimitPages = 16384
	}
	if o.CompileWorkers == 0 {
		o.CompileWorkers = runtime.GOMAXPROCS(0)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Spec is one run of a WASI command module.
type Spec struct {
	// Module is the WebAssembly binary. The caller reads it (from the
	// attempt root or from the CAS); Run hashes it to find its compiled
	// form.
	Module []byte
	// Args is argv, program name first by convention (WASI passes it
	// verbatim). No NUL bytes.
	Args []string
	// Env holds KEY=VALUE pairs; nothing of the host's environment is
	// passed.
	Env []string
	// Stdin, Stdout and Stderr are streamed while the module runs; nil
	// means empty input and discarded output. Run never closes them. A
	// stream with deadlines (os.Pipe, net.Conn) is unblocked when ctx
	// ends; a plain reader that blocks keeps Run waiting until it returns.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Root is the host directory the guest sees as "/": the attempt's
	// overlay root. The guest's writes land in it. Symlinks resolve
	// inside it, as under chroot.
	Root string
	// ExtraReadOnly mounts more host directories, read-only, at guest
	// paths (absolute, clean, not "/"). The guest path need not exist in
	// Root.
	ExtraReadOnly map[string]string
	// MemoryLimitPages caps the module's linear memory in 64 KiB pages;
	// 0 means the Runtime's default.
	MemoryLimitPages uint32
}

func (s *Spec) validate() error {
	if len(s.Module) == 0 {
		return fmt.Errorf("run: no module: %w", ErrInvalidArgument)
	}
	if len(s.Module) > MaxModuleSize {
		return fmt.Errorf("run: module of %d bytes, above %d: %w", len(s.Module), MaxModuleSize, ErrInvalidArgument)
	}
	if !filepath.IsAbs(s.Root) {
		return fmt.Errorf("run: root %q is not an absolute path: %w", s.Root, ErrInvalidArgument)
	}
	for _, a := range s.Args {
		if strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("run: argument %q holds a NUL byte: %w", a, ErrInvalidArgument)
		}
	}
	for _, e := range s.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.IndexByte(e, 0) >= 0 {
			return fmt.Errorf("run: environment entry %q is not KEY=VALUE: %w", e, ErrInvalidArgument)
		}
	}
	for guest, host := range s.ExtraReadOnly {
		if !path.IsAbs(guest) || path.Clean(guest) != guest || guest == "/" {
			return fmt.Errorf("run: read-only mount point %q must be an absolute, clean path other than /: %w", guest, ErrInvalidArgument)
		}
		if !filepath.IsAbs(host) {
			return fmt.Errorf("run: read-only mount source %q is not an absolute path: %w", host, ErrInvalidArgument)
		}
	}
	if s.MemoryLimitPages > MaxMemoryLimitPages {
		return fmt.Errorf("run: memory limit %d pages above %d: %w", s.MemoryLimitPages, MaxMemoryLimitPages, ErrInvalidArgument)
	}
	return nil
}

// Result is how a run ended. A module that exits with a non-zero code, or
// traps, is a Result, not an error: errors are for runs that could not
// happen or did not finish (timeout, memory limit).
type Result struct {
	ExitCode int           // from proc_exit; TrapExitCode after a trap
	Trap     string        // the trap's message, when the module trapped
	ModuleID cas.ID        // BLAKE3 of the module, as the CAS names it
	Compiled bool          // this run compiled the module (not in memory)
	Compile  time.Duration // time spent compiling, when Compiled
	Duration time.Duration // the whole Run, compile included
	// MemoryPages is the largest the linear memory grew to.
	MemoryPages uint32
}

// Runtime runs WASI modules. Create one per daemon; it is safe for
// concurrent use.
type Runtime struct {
	opts  Options
	cache wazero.CompilationCache
	rt    wazero.Runtime
	mods  *modules
	mem   *budget // nil: unbounded

	mu     sync.Mutex
	closed bool
	active map[*int]context.CancelFunc // runs in flight, stopped by Close
	runs   sync.WaitGroup
}

// New creates a Runtime. It creates CacheDir if needed.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	var cache wazero.CompilationCache
	if opts.CacheDir != "" {
		cache, err = wazero.NewCompilationCacheWithDir(opts.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("wasi: compilation cache %s: %w", opts.CacheDir, err)
		}
	} else {
		cache = wazero.NewCompilationCache()
	}
	cfg := wazero.NewRuntimeConfig().
		WithCompilationCache(cache).
		// Stops a module when the context of its call ends: without it a
		// loop in the guest holds its goroutine forever.
		WithCloseOnContextDone(true)
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		_ = rt.Close(ctx)
		_ = cache.Close(ctx)
		return nil, fmt.Errorf("wasi: instantiate wasi_snapshot_preview1: %w", err)
	}
	r := &Runtime{opts: opts, cache: cache, rt: rt, active: map[*int]context.CancelFunc{}}
	r.mods = newModules(r.compile, opts.MaxCompiled)
	if opts.MemoryBudget > 0 {
		r.mem = &budget{total: opts.MemoryBudget}
	}
	return r, nil
}

func (r *Runtime) compile(ctx context.Context, bin []byte) (wazero.CompiledModule, error) {
	start := time.Now()
	cm, err := r.rt.CompileModule(experimental.WithCompilationWorkers(ctx, r.opts.CompileWorkers), bin)
	if err != nil {
		return nil, err
	}
	r.opts.Logger.Debug("wasi: compiled module", "bytes", len(bin), "took", time.Since(start))
	return cm, nil
}

// Close stops new runs, stops the runs in flight (their Run returns
// ErrUnavailable) and waits for them, then releases the compiled code. The
// disk cache stays. Runs are stopped through their contexts, like a
// timeout, and never by closing their modules from here, under a guest
// still running: Run closes its module once the guest has stopped. Close
// waits for every run, so a run blocked reading a Stdin without deadlines
// holds it until that read returns.
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	for _, cancel := range r.active {
		cancel()
	}
	r.mu.Unlock()
	r.runs.Wait()
	err := r.rt.Close(ctx)
	r.mods.closeAll(ctx)
	return errors.Join(err, r.cache.Close(ctx))
}

// enter registers a run; leave undoes it. The run's context is cancelled
// by Close.
func (r *Runtime) enter(ctx context.Context) (runCtx context.Context, leave func(), err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, nil, fmt.Errorf("wasi: runtime closed: %w", ErrUnavailable)
	}
	runCtx, cancel := context.WithCancel(ctx)
	key := new(int)
	r.active[key] = cancel
	r.runs.Add(1)
	return runCtx, func() {
		r.mu.Lock()
		delete(r.active, key)
		r.mu.Unlock()
		cancel()
		r.runs.Done()
	}, nil
}

// Run instantiates spec.Module against spec.Root and runs its _start. It
// returns when the module exits, traps, or ctx ends; in the last case the
// module is stopped and the error wraps ctx.Err() (context.DeadlineExceeded
// for a timeout). A module whose memory.grow was refused by its limit and
// that then failed is ErrQuotaExceeded (with the Result filled in).
// Nothing started by Run outlives it.
func (r *Runtime) Run(ctx context.Context, spec Spec) (res Result, err error) {
	start := time.Now()
	defer func() { res.Duration = time.Since(start) }()
	// runCtx is ctx, also cancelled by Close; everything below waits on
	// it, and outcome tells the two causes apart.
	runCtx, leave, err := r.enter(ctx)
	if err != nil {
		return res, err
	}
	defer leave()
	if err := spec.validate(); err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("run: %w", err)
	}
	limit := spec.MemoryLimitPages
	if limit == 0 {
		limit = r.opts.DefaultMemoryLimitPages
	}

	res.ModuleID = cas.Sum(spec.Module)
	name := "module " + res.ModuleID.Short()
	compileStart := time.Now()
	m, compiled, err := r.mods.acquire(runCtx, res.ModuleID, spec.Module)
	if compiled {
		res.Compiled, res.Compile = true, time.Since(compileStart)
	}
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return res, fmt.Errorf("compile %s: %w", name, ctx.Err())
		case runCtx.Err() != nil:
			return res, fmt.Errorf("compile %s: runtime closed: %w", name, ErrUnavailable)
		}
		return res, fmt.Errorf("compile %s: %v: %w", name, err, ErrInvalidArgument)
	}
	defer r.mods.release(m)
	need := minPages(m.cm)
	if need > limit {
		return res, fmt.Errorf("run %s: it declares %d pages of memory, above its limit of %d: %w", name, need, limit, ErrQuotaExceeded)
	}
	lim := &limiter{limit: uint64(limit) * pageSize, budget: r.mem}
	// Deferred first, so it runs last: after the module is closed. What
	// the pool does not keep goes back to the system now, not whenever
	// the scavenger gets to it: a daemon's memory returns after a burst.
	defer func() {
		if dropped := lim.recycle(); dropped >= 64<<20 {
			debug.FreeOSMemory()
		}
	}()
	if r.mem != nil {
		floor := uint64(need) * pageSize
		if floor > r.mem.total {
			return res, fmt.Errorf("run %s: it declares %d MiB of memory, above the daemon's WASI memory budget of %d MiB: %w", name, floor>>20, r.mem.total>>20, ErrQuotaExceeded)
		}
		// The run takes its whole limit (at most the budget) before it
		// starts, so that concurrent runs cannot starve each other by
		// each holding part of the budget: beyond it, runs queue.
		take := min(max(floor, lim.limit), r.mem.total)
		if err := r.mem.acquire(runCtx, take); err != nil {
			return res, fmt.Errorf("run %s: waiting for WASI memory: %w", name, stopped(ctx, runCtx))
		}
		lim.charged = take
	}

	fsc, closeFS, err := mounts(spec)
	if err != nil {
		return res, err
	}
	defer closeFS()

	callCtx := experimental.WithMemoryAllocator(runCtx, lim)
	cfg := wazero.NewModuleConfig().
		WithName("").         // anonymous: any number may run at once
		WithStartFunctions(). // _start is called below, once memory is checked
		WithArgs(spec.Args...).
		WithFSConfig(fsc).
		WithSysWalltime().
		WithSysNanotime().
		WithNanosleep(sleeper(runCtx)).
		WithRandSource(rand.Reader)
	for _, e := range spec.Env {
		k, v, _ := strings.Cut(e, "=")
		cfg = cfg.WithEnv(k, v)
	}
	if spec.Stdin != nil {
		cfg = cfg.WithStdin(&stdin{ctx: runCtx, r: spec.Stdin})
	}
	if spec.Stdout != nil {
		cfg = cfg.WithStdout(&stdout{ctx: runCtx, w: spec.Stdout})
	}
	if spec.Stderr != nil {
		cfg = cfg.WithStderr(&stdout{ctx: runCtx, w: spec.Stderr})
	}
	stop := unblockOnDone(runCtx, spec.Stdin, spec.Stdout, spec.Stderr)
	defer stop()

	mod, err := instantiate(callCtx, r.rt, m.cm, cfg)
	if mod != nil {
		// Before closeFS (deferred earlier, so run later): closing the
		// module closes the guest's open files.
		defer mod.Close(context.WithoutCancel(ctx))
	}
	if err != nil {
		if d := lim.denied.Load(); d > 0 {
			if lim.overBudget.Load() {
				return res, fmt.Errorf("run %s: initial memory of %d pages does not fit the daemon's WASI memory budget of %d MiB: %w", name, d/pageSize, r.mem.total>>20, ErrQuotaExceeded)
			}
			return res, fmt.Errorf("run %s: initial memory of %d pages above its limit of %d: %w", name, d/pageSize, limit, ErrQuotaExceeded)
		}
		if runCtx.Err() != nil {
			return res, fmt.Errorf("run %s: %w", name, stopped(ctx, runCtx))
		}
		return res, fmt.Errorf("instantiate %s: %v: %w", name, err, ErrInvalidArgument)
	}
	entry := mod.ExportedFunction("_start")
	if entry == nil {
		return res, fmt.Errorf("run %s: no _start export (not a WASI command): %w", name, ErrInvalidArgument)
	}
	_, callErr := entry.Call(callCtx)
	res.MemoryPages = uint32(lim.peak.Load() / pageSize)
	return outcome(ctx, runCtx, name, res, callErr, lim, spec.Stderr)
}

// outcome turns the error of _start into a Result or an error. runCtx
// ends with ctx or when the Runtime is closed.
func outcome(ctx, runCtx context.Context, name string, res Result, callErr error, lim *limiter, stderr io.Writer) (Result, error) {
	var exit *sys.ExitError
	isExit := errors.As(callErr, &exit)
	switch {
	case callErr == nil:
		res.ExitCode = 0
	case isExit && exit.ExitCode() == 0:
		res.ExitCode = 0
	case runCtx.Err() != nil:
		// Stopped by wazero, or failing because its streams and sleeps
		// were cut short when the context ended: either way it did not
		// finish in time. (A guest may also pass wazero's deadline code
		// to proc_exit itself; without an ended context that is an exit
		// code like any other.)
		return res, fmt.Errorf("run %s: %w", name, stopped(ctx, runCtx))
	case isExit:
		res.ExitCode = int(exit.ExitCode())
	default:
		res.ExitCode, res.Trap = TrapExitCode, callErr.Error()
		if stderr != nil {
			fmt.Fprintf(stderr, "wasi: %s trapped: %v\n", name, callErr)
		}
	}
	if d := lim.denied.Load(); d > 0 && res.ExitCode != 0 && lim.overBudget.Load() {
		return res, fmt.Errorf("run %s: a grow to %d pages did not fit the daemon's WASI memory budget of %d MiB (shared by all running modules), then it exited with code %d: %w",
			name, (d+pageSize-1)/pageSize, lim.budget.total>>20, res.ExitCode, ErrQuotaExceeded)
	}
	if d := lim.denied.Load(); d > 0 && res.ExitCode != 0 {
		return res, fmt.Errorf("run %s: exceeded its memory limit of %d pages (%d MiB): a grow to %d pages was refused, then it exited with code %d: %w",
			name, lim.limit/pageSize, lim.limit>>20, (d+pageSize-1)/pageSize, res.ExitCode, ErrQuotaExceeded)
	}
	return res, nil
}

// stopped says why runCtx ended: the caller's context, or Runtime.Close.
func stopped(ctx, runCtx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("stopped: %w", err)
	}
	return fmt.Errorf("stopped: runtime closed: %w", ErrUnavailable)
}

// instantiate wraps wazero's, which indexes the first allocation of a
// memory without checking it: a module that hides a minimum above its
// limit (minPages cannot see an unexported memory) panics there instead
// of failing. The panic happens before the module is registered, so
// nothing is left behind.
func instantiate(ctx context.Context, rt wazero.Runtime, cm wazero.CompiledModule, cfg wazero.ModuleConfig) (mod api.Module, err error) {
	defer func() {
		if p := recover(); p != nil {
			mod, err = nil, fmt.Errorf("instantiate: %v", p)
		}
	}()
	return rt.InstantiateModule(ctx, cm, cfg)
}

// minPages is the initial size a module asks for its memory.
func minPages(cm wazero.CompiledModule) uint32 {
	var n uint32
	for _, m := range cm.ImportedMemories() {
		n = max(n, m.Min())
	}
	for _, m := range cm.ExportedMemories() {
		n = max(n, m.Min())
	}
	return n
}

// mounts builds the guest's file system: Root at "/" and the read-only
// extras, each confined to its host directory.
func mounts(spec Spec) (wazero.FSConfig, func(), error) {
	var opened []*rootFS
	closeAll := func() {
		for _, f := range opened {
			_ = f.close()
		}
	}
	fail := func(what, dir string, err error) (wazero.FSConfig, func(), error) {
		closeAll()
		if errors.Is(err, ErrUnsupported) {
			return nil, nil, err
		}
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("run: %s %s: %w", what, dir, ErrNotFound)
		}
		return nil, nil, fmt.Errorf("run: %s %s: %v: %w", what, dir, err, ErrInvalidArgument)
	}
	root, err := openRootFS(spec.Root, false)
	if err != nil {
		return fail("root", spec.Root, err)
	}
	opened = append(opened, root)
	cfg := wazero.NewFSConfig().(sysfs.FSConfig).WithSysFSMount(root, "/")
	guests := make([]string, 0, len(spec.ExtraReadOnly))
	for g := range spec.ExtraReadOnly {
		guests = append(guests, g)
	}
	slices.Sort(guests)
	for _, g := range guests {
		ro, err := openRootFS(spec.ExtraReadOnly[g], true)
		if err != nil {
			return fail("read-only mount", spec.ExtraReadOnly[g], err)
		}
		opened = append(opened, ro)
		cfg = cfg.(sysfs.FSConfig).WithSysFSMount(ro, g)
	}
	return cfg, closeAll, nil
}

// sleeper is the guest's nanosleep (poll_oneoff with a clock, which is how
// Go's and Rust's runtimes wait). wazero's default sleeps through the
// context's end; this one wakes up, and the termination check stops the
// guest at its next instruction.
func sleeper(ctx context.Context) sys.Nanosleep {
	return func(ns int64) {
		t := time.NewTimer(time.Duration(ns))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
}
