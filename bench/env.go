package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/api/client"
	"github.com/esf-dev/esf/fabric"
)

// Config says what Run measures and where.
type Config struct {
	// Quick uses the smaller sizes (5k instead of 100k files, 256 MiB
	// instead of 1 GiB, a 50k- instead of a 1M-node graph).
	Quick bool
	// Root is the scratch directory of the run; it must not exist. Default
	// /var/tmp/esf-bench-<pid> (not /tmp: see doc.go).
	Root string
	// Keep leaves Root in place after the run (mounts are still removed).
	Keep bool
	// Only, if set, selects scenarios by name.
	Only *regexp.Regexp
	// SelfCommand runs this program in a helper role (see RunRole), e.g.
	// the test binary and RoleArg. Empty runs the projection in-process
	// and skips the go-fuse loopback baseline.
	SelfCommand []string
	// ProfileDir, if set, receives a CPU profile per scenario
	// (<scenario>.pprof), its blocking and lock contention
	// (<scenario>.block.pprof, <scenario>.mutex.pprof: where goroutines of
	// this process waited, e.g. for a lock held across a flush) and makes
	// the projection servers write theirs.
	ProfileDir string
	// TraceDir, if set, receives an execution trace per scenario
	// (<scenario>.trace): what every goroutine of this process waited on
	// and for how long (go tool trace -pprof=syscall, sync, net, sched),
	// e.g. which syscalls a rollout's phases spend their time in. Large:
	// select one scenario.
	TraceDir string
	// ViaFabric drives graph and attempt operations as Fabric methods
	// instead of through the API client: what the transport costs is the
	// difference.
	ViaFabric bool
	// LogDir, if set, receives each daemon's log (JSON lines, info level):
	// the API server logs every request's server-side time, and seal logs
	// its own.
	LogDir string
	// Logf receives progress lines; default discard.
	Logf func(format string, args ...any)
}

// Env is what a scenario measures with: the main daemon and the datasets,
// scratch space on the state dir's file system, and the rows it reports.
// A scenario runs on one goroutine; Env is not safe for concurrent use.
type Env struct {
	// Quick is Config.Quick.
	Quick bool
	// Dir is the run's scratch root; every path a scenario creates lives
	// under it, on the same file system as the state dirs.
	Dir string

	cfg  Config
	main *Daemon
	logf func(format string, args ...any)

	rows     []Row
	scenario string
	cleanups [][]func() error // one frame per scenario, and one for the run
	seq      int

	// Datasets and imported roots, made on first use and shared.
	trees  map[int]string
	big    string
	roots  map[string]string // source dir -> root id in the main daemon
	groups map[string]fabric.CreateGroupResult
}

// Add records a row of the current scenario.
func (e *Env) Add(r Row) {
	r.judge()
	e.logf("  %-46s %10s %-6s %s", r.Name, trimFloat(r.Value), r.Unit, r.Verdict)
	e.rows = append(e.rows, r)
}

// TODO records a row that cannot be measured yet and says why.
func (e *Env) TODO(name, why string) {
	e.rows = append(e.rows, Row{Name: name, Verdict: VerdictTODO, Note: why})
}

// Logf reports progress.
func (e *Env) Logf(format string, args ...any) { e.logf(format, args...) }

// Size returns quick in quick mode and full otherwise.
func (e *Env) Size(quick, full int) int {
	if e.Quick {
		return quick
	}
	return full
}

// Cleanup registers fn to run when the current scenario ends (or the run,
// for what Env itself sets up), last registered first.
func (e *Env) Cleanup(fn func() error) {
	top := len(e.cleanups) - 1
	e.cleanups[top] = append(e.cleanups[top], fn)
}

// Mkdir creates a fresh directory named after name under Dir.
func (e *Env) Mkdir(name string) (string, error) {
	e.seq++
	d := filepath.Join(e.Dir, "work", fmt.Sprintf("%s-%d", name, e.seq))
	return d, os.MkdirAll(d, 0o755)
}

// Main returns the daemon most scenarios drive, starting it on first use:
// it lives until the end of the run, so the roots and groups it holds are
// shared by every scenario.
func (e *Env) Main(ctx context.Context) (*Daemon, error) {
	if e.main != nil {
		return e.main, nil
	}
	d, err := e.startDaemon(ctx, "main", 0)
	if err != nil {
		return nil, err
	}
	e.main = d
	return d, nil
}

// Daemon is one esf daemon inside the benchmark process: a Fabric with
// its API server on a unix socket and a client of it, as esfctl sees esfd.
type Daemon struct {
	Fabric   *fabric.Fabric
	Client   *client.Client
	Ops      *Ops
	StateDir string
	Socket   string
	close    func() error
}

// StartDaemon opens a Fabric in a fresh state dir under Dir and serves its
// API on a socket there. With Config.SelfCommand the projection runs in a
// child process, as esfd runs it. configure, if given, edits the Fabric's
// options first (an executor, a WASI runtime). The daemon is torn down
// (attempts released, projection stopped) when the current scenario ends.
func (e *Env) StartDaemon(ctx context.Context, name string, configure ...func(*fabric.Options)) (*Daemon, error) {
	return e.startDaemon(ctx, name, len(e.cleanups)-1, configure...)
}

// startDaemon starts a daemon torn down with cleanup frame `frame`.
func (e *Env) startDaemon(ctx context.Context, name string, frame int, configure ...func(*fabric.Options)) (*Daemon, error) {
	e.seq++
	dir := filepath.Join(e.Dir, fmt.Sprintf("d%d-%s", e.seq, name))
	d := &Daemon{StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "esfd.sock")}
	log := slog.New(slog.DiscardHandler)
	if e.cfg.LogDir != "" {
		lf, err := os.Create(filepath.Join(e.cfg.LogDir, fmt.Sprintf("d%d-%s.log", e.seq, name)))
		if err != nil {
			return nil, err
		}
		e.cleanups[frame] = append(e.cleanups[frame], lf.Close)
		log = slog.New(slog.NewJSONHandler(lf, nil))
	}
	opts := fabric.Options{StateDir: d.StateDir, Logger: log}
	if len(e.cfg.SelfCommand) > 0 {
		opts.ProjectionCommand = append(slices.Clone(e.cfg.SelfCommand), roleFuseServer, d.StateDir)
		if e.cfg.ProfileDir != "" {
			opts.ProjectionCommand = append(opts.ProjectionCommand,
				filepath.Join(e.cfg.ProfileDir, fmt.Sprintf("fuse-server-%s-%d.pprof", name, e.seq)))
		}
	}
	for _, c := range configure {
		c(&opts)
	}
	f, err := fabric.Open(ctx, opts)
	if err != nil {
		return nil, err
	}
	d.Fabric = f
	ln, err := api.Listen(d.Socket)
	if err != nil {
		f.Close()
		return nil, err
	}
	srv := api.NewServer(f, api.ServerOptions{Logger: log})
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln, 10*time.Second) }()
	d.Client = client.NewClient(d.Socket)
	d.Ops = &Ops{c: d.Client, f: f, viaFabric: e.cfg.ViaFabric}
	d.close = sync.OnceValue(func() error {
		d.Client.Close()
		stop()
		serr := <-served
		aerr := f.StopAll(context.Background())
		return errors.Join(serr, aerr, f.Close())
	})
	e.cleanups[frame] = append(e.cleanups[frame], d.Close)
	return d, nil
}

// Close tears the daemon down early (releases its attempts, stops its
// projection and API server, closes the Fabric); the scenario's end does it
// otherwise. It is idempotent.
func (d *Daemon) Close() error { return d.close() }

// Results is what a run produced.
type Results struct {
	Machine Machine `json:"machine"`
	Rows    []Row   `json:"rows"`
}

// Run measures every selected scenario once, in one process, and returns
// the rows. Setup failures are errors; a failing scenario is an error row.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Root == "" {
		cfg.Root = fmt.Sprintf("/var/tmp/esf-bench-%d", os.Getpid())
	}
	root, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, err
	}
	if err := os.Mkdir(root, 0o755); err != nil {
		return nil, fmt.Errorf("bench root: %w", err)
	}
	e := &Env{
		Quick: cfg.Quick, Dir: root, cfg: cfg, logf: cfg.Logf,
		cleanups: [][]func() error{nil},
		trees:    map[int]string{}, roots: map[string]string{}, groups: map[string]fabric.CreateGroupResult{},
	}
	res := &Results{Machine: probeMachine(root, cfg.Quick)}
	defer func() {
		if cfg.Keep {
			return
		}
		start := time.Now()
		if err := removeAll(root); err != nil {
			cfg.Logf("remove %s: %v", root, err)
		}
		cfg.Logf("removed %s in %v", root, time.Since(start).Round(time.Millisecond))
	}()

	all := scenarios()
	replaced := map[string]bool{}
	for _, s := range all {
		for _, r := range s.Replaces {
			replaced[r] = true
		}
	}
	for _, s := range all {
		if cfg.Only != nil && !cfg.Only.MatchString(s.Name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		e.runScenario(ctx, s)
	}
	for _, t := range todoRows {
		if !replaced[t.key] && (cfg.Only == nil || cfg.Only.MatchString(t.key)) {
			e.TODO(t.row, t.why)
		}
	}

	// Tear down what the run set up, then make sure no mount is left.
	for _, err := range e.unwind(0) {
		e.rows = append(e.rows, Row{Name: "teardown", Verdict: VerdictError, Note: err.Error()})
	}
	for _, m := range mountsUnder(root) {
		e.rows = append(e.rows, Row{Name: "teardown", Verdict: VerdictError, Note: "mount left behind (detached): " + m})
		unix.Unmount(m, unix.MNT_DETACH)
	}
	res.Machine.LoadEnd = loadavg()
	res.Rows = e.rows
	return res, nil
}

func (e *Env) runScenario(ctx context.Context, s Scenario) {
	e.scenario = s.Name
	e.logf("== %s", s.Name)
	start := time.Now()
	e.cleanups = append(e.cleanups, nil)
	var prof *os.File
	if e.cfg.ProfileDir != "" {
		if f, err := os.Create(filepath.Join(e.cfg.ProfileDir, s.Name+".pprof")); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				prof = f
			} else {
				f.Close()
			}
		}
		// Sample blocking events of 10 µs and more, and one contended
		// lock in 5: cheap enough not to change what is measured.
		runtime.SetBlockProfileRate(int((10 * time.Microsecond).Nanoseconds()))
		runtime.SetMutexProfileFraction(5)
	}
	var traceFile *os.File
	if e.cfg.TraceDir != "" {
		if f, err := os.Create(filepath.Join(e.cfg.TraceDir, s.Name+".trace")); err == nil {
			if trace.Start(f) == nil {
				traceFile = f
			} else {
				f.Close()
			}
		}
	}
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				buf := make([]byte, 8<<10)
				err = fmt.Errorf("panic: %v\n%s", p, buf[:runtime.Stack(buf, false)])
			}
		}()
		return s.Run(ctx, e)
	}()
	if prof != nil {
		pprof.StopCPUProfile()
		prof.Close()
	}
	if traceFile != nil {
		trace.Stop()
		traceFile.Close()
	}
	if e.cfg.ProfileDir != "" {
		// The block and mutex profiles accumulate over the process's life:
		// one per scenario is right when a run selects one scenario, and a
		// running total otherwise.
		for _, name := range []string{"block", "mutex"} {
			if f, err := os.Create(filepath.Join(e.cfg.ProfileDir, s.Name+"."+name+".pprof")); err == nil {
				_ = pprof.Lookup(name).WriteTo(f, 0)
				f.Close()
			}
		}
		runtime.SetBlockProfileRate(0)
		runtime.SetMutexProfileFraction(0)
	}
	if err != nil {
		e.rows = append(e.rows, Row{Name: s.Name, Verdict: VerdictError, Note: err.Error()})
		e.logf("  %s: %v", s.Name, err)
	}
	for _, err := range e.unwind(len(e.cleanups) - 1) {
		e.rows = append(e.rows, Row{Name: s.Name + " teardown", Verdict: VerdictError, Note: err.Error()})
	}
	e.cleanups = e.cleanups[:len(e.cleanups)-1]
	if len(e.cleanups) == 0 {
		e.cleanups = [][]func() error{nil}
	}
	e.logf("   (%s: %v)", s.Name, time.Since(start).Round(time.Millisecond))
}

// unwind runs the cleanups of frame i, last first.
func (e *Env) unwind(i int) []error {
	var errs []error
	fns := e.cleanups[i]
	e.cleanups[i] = nil
	for j := len(fns) - 1; j >= 0; j-- {
		if err := fns[j](); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// todoRows are the scenarios that need code that does not exist
// yet; a registered scenario whose Replaces names the key supersedes one.
var todoRows = []struct{ key, row, why string }{
	{"runc", "runc activate + first exec vs bare runc run", "executor/runc not built yet (target ≤1.3× bare runc run); register a scenario with Replaces: [\"runc\"]"},
	{"wasi", "wasi activate + run, warm cache", "WASI executor not built yet (target ≤20 ms warm); register a scenario with Replaces: [\"wasi\"]"},
	{"wasi", "wasi activate + run, cold cache", "WASI executor not built yet; register a scenario with Replaces: [\"wasi\"]"},
	{"gc", "gc throughput", "GC not built yet; register a scenario with Replaces: [\"gc\"]"},
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil
	}
	var out []string
	for _, in := range infos {
		out = append(out, in.Mountpoint)
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}
