package runc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	gorunc "github.com/containerd/go-runc"

	"github.com/esf-dev/esf/executor"
)

// Options configure an Executor.
type Options struct {
	// StateDir holds runc's state and the bundles; created if missing.
	// Required. Keep it on a local filesystem; a tmpfs is fine (after a
	// reboot there is nothing to adopt anyway).
	StateDir string
	// Init is the static init binary (executor/init) mounted at
	// executor.InitPath. Required.
	Init string
	// Runtime is the runc binary; "runc" (found in PATH) when empty.
	Runtime string
	// Namespace is the containerd namespace the spec is generated in; it
	// names the cgroup parent (/<Namespace>/<id>). "esf" when empty.
	Namespace string
	// DrainTimeout bounds how long an exec's output is still read once
	// runc exec has exited (by then every writer is gone, so this is a
	// safety net, not a wait). 200ms when zero.
	DrainTimeout time.Duration
	// CommandTimeout bounds every runc control command (run, pause,
	// resume, delete, state, list, ps). 30s when zero.
	CommandTimeout time.Duration
	// Logger receives what the executor cannot return (a footprint it
	// could not remove). Discarded when nil.
	Logger *slog.Logger
}

func (o *Options) withDefaults() (Options, error) {
	v := *o
	if v.StateDir == "" || !filepath.IsAbs(v.StateDir) {
		return v, fmt.Errorf("runc executor: state dir %q: want an absolute path: %w", v.StateDir, executor.ErrInvalidArgument)
	}
	if v.Init == "" || !filepath.IsAbs(v.Init) {
		return v, fmt.Errorf("runc executor: init %q: want an absolute path: %w", v.Init, executor.ErrInvalidArgument)
	}
	fi, err := os.Stat(v.Init)
	if err != nil {
		return v, fmt.Errorf("runc executor: init: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return v, fmt.Errorf("runc executor: init %s is not an executable file: %w", v.Init, executor.ErrInvalidArgument)
	}
	if v.Runtime == "" {
		v.Runtime = "runc"
	}
	if v.Runtime, err = exec.LookPath(v.Runtime); err != nil {
		return v, fmt.Errorf("runc executor: runtime: %v: %w", err, executor.ErrUnsupported)
	}
	if v.Namespace == "" {
		v.Namespace = "esf"
	}
	if !validID.MatchString(v.Namespace) {
		return v, fmt.Errorf("runc executor: namespace %q: %w", v.Namespace, executor.ErrInvalidArgument)
	}
	if v.DrainTimeout <= 0 {
		v.DrainTimeout = 200 * time.Millisecond
	}
	if v.CommandTimeout <= 0 {
		v.CommandTimeout = 30 * time.Second
	}
	if v.Logger == nil {
		v.Logger = slog.New(slog.DiscardHandler)
	}
	return v, nil
}

// Executor runs runc containers. Create it with New.
type Executor struct {
	opts    Options
	rc      gorunc.Runc // template; copied per call that needs its own log
	bundles string

	mu    sync.Mutex
	locks map[string]*idLock

	// noAgent makes every exec use runc exec (tests compare the two).
	noAgent bool
}

var _ executor.Executor = (*Executor)(nil)

type idLock struct {
	mu   sync.Mutex
	refs int
}

// New checks opts and prepares the state dir. It runs nothing.
func New(opts Options) (*Executor, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(o.StateDir, "runc")
	bundles := filepath.Join(o.StateDir, "bundles")
	for _, d := range []string{o.StateDir, root, bundles} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("runc executor: %w", err)
		}
	}
	return &Executor{
		opts: o,
		rc: gorunc.Runc{
			Command: o.Runtime,
			Root:    root,
			// A terminal's ^C in esfd's foreground must not reach runc,
			// which would forward it into a container.
			Setpgid: true,
		},
		bundles: bundles,
		locks:   map[string]*idLock{},
	}, nil
}

// Root is runc's --root, for tools and tests that look at runc directly.
func (e *Executor) Root() string { return e.rc.Root }

// validID is runc's own rule for container ids; "." and ".." pass it but
// would escape the bundles dir, so checkID refuses them too.
var validID = regexp.MustCompile(`^[\w+\-.]+$`)

func checkID(id string) error {
	if len(id) > 128 || !validID.MatchString(id) || id == "." || id == ".." {
		return fmt.Errorf("container id %q: want 1..128 of [A-Za-z0-9_+.-]: %w", id, executor.ErrInvalidArgument)
	}
	return nil
}

// lock serialises the control operations of one id.
func (e *Executor) lock(id string) func() {
	e.mu.Lock()
	l := e.locks[id]
	if l == nil {
		l = &idLock{}
		e.locks[id] = l
	}
	l.refs++
	e.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		e.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(e.locks, id)
		}
		e.mu.Unlock()
	}
}

// command bounds one runc control command. It is detached from the
// caller's cancellation on purpose (see the package doc).
func (e *Executor) command(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), e.opts.CommandTimeout)
}

func (e *Executor) bundle(id string) string { return filepath.Join(e.bundles, id) }

// Start implements executor.Executor.
func (e *Executor) Start(ctx context.Context, id string, spec executor.Spec) (err error) {
	if err := checkID(id); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	if fi, err := os.Stat(spec.Rootfs); err != nil || !fi.IsDir() {
		return fmt.Errorf("start %s: rootfs %s is not a directory: %w", id, spec.Rootfs, executor.ErrInvalidArgument)
	}
	for _, m := range spec.Mounts {
		if _, err := os.Stat(m.Source); err != nil {
			return fmt.Errorf("start %s: mount source: %v: %w", id, err, executor.ErrInvalidArgument)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	unlock := e.lock(id)
	defer unlock()

	bundle := e.bundle(id)
	if err := os.Mkdir(bundle, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("start %s: %w", id, executor.ErrExists)
		}
		return fmt.Errorf("start %s: %w", id, err)
	}
	// From here on every failure removes what was made, the container
	// included if runc got that far.
	defer func() {
		if err != nil {
			if serr := e.stopLocked(ctx, id); serr != nil {
				e.opts.Logger.Warn("runc executor: cleanup after a failed start", "id", id, "err", serr)
			}
		}
	}()

	s, err := e.containerSpec(ctx, id, spec)
	if err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	if err := checkLeaves(spec.Rootfs, mountLeaves(s.Mounts)); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	// Recorded before runc makes anything, so that Stop (even after a
	// crash) knows which mountpoints were ours.
	created, err := absentFootprint(spec.Rootfs, mountLeaves(s.Mounts))
	if err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	if err := writeJSON(filepath.Join(bundle, footprintFile), created); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	if err := writeJSON(filepath.Join(bundle, "config.json"), s); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}

	logPath := filepath.Join(bundle, "runc.log")
	rc := e.rc
	rc.Log, rc.LogFormat = logPath, gorunc.JSON
	// The init serves execs on this socket (agent.go); after runc has
	// handed it over, the init holds the only copy.
	ln, err := listenAgent(bundle)
	if err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	defer ln.Close()
	cctx, cancel := e.command(ctx)
	defer cancel()
	if _, err := rc.Run(cctx, id, bundle, &gorunc.CreateOpts{Detach: true, ExtraFiles: []*os.File{ln}}); err != nil {
		// The spec was checked; what runc refuses now is the host's doing.
		return fmt.Errorf("start %s: runc run: %s", id, runcMessage(logPath, err))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	return nil
}

// Stop implements executor.Executor.
func (e *Executor) Stop(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	unlock := e.lock(id)
	defer unlock()
	return e.stopLocked(ctx, id)
}

func (e *Executor) stopLocked(ctx context.Context, id string) error {
	cctx, cancel := e.command(ctx)
	defer cancel()
	// delete --force kills every process (thawing a frozen container
	// first) and succeeds for an id runc does not know.
	if err := e.rc.Delete(cctx, id, &gorunc.DeleteOpts{Force: true}); err != nil {
		return fmt.Errorf("stop %s: runc delete: %w", id, err)
	}
	bundle := e.bundle(id)
	var created []footprintEntry
	if err := readJSON(filepath.Join(bundle, footprintFile), &created); err == nil {
		if rootfs, err := bundleRootfs(bundle); err == nil {
			for _, c := range created {
				if err := removeCreated(rootfs, c); err != nil {
					e.opts.Logger.Warn("runc executor: footprint left in rootfs", "id", id, "path", c.Leaf, "err", err)
				}
			}
		}
	}
	if err := os.RemoveAll(bundle); err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	return nil
}

// Freeze implements executor.Executor.
func (e *Executor) Freeze(ctx context.Context, id string) error {
	return e.pauseResume(ctx, "freeze", id, executor.StatusPaused, e.rc.Pause)
}

// Thaw implements executor.Executor.
func (e *Executor) Thaw(ctx context.Context, id string) error {
	return e.pauseResume(ctx, "thaw", id, executor.StatusRunning, e.rc.Resume)
}

func (e *Executor) pauseResume(ctx context.Context, op, id string, want executor.Status, do func(context.Context, string) error) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s %s: %w", op, id, err)
	}
	unlock := e.lock(id)
	defer unlock()
	// The cgroup's freezer is what runc would write, without runc
	// (freeze.go); a container whose cgroup is not there (stopped) or not
	// where we look goes to runc, which also explains a refusal.
	handled, err := e.freezeCgroup(ctx, id, want == executor.StatusPaused)
	if handled {
		if err != nil {
			return fmt.Errorf("%s %s: %w", op, id, err)
		}
		return nil
	}
	cctx, cancel := e.command(ctx)
	defer cancel()
	err = do(cctx, id)
	if err == nil {
		return nil
	}
	// runc refuses to pause a paused container and to resume a running
	// one; both are success here. Only the failure path pays for State.
	info, serr := e.state(ctx, id)
	switch {
	case serr != nil:
		return fmt.Errorf("%s %s: %w", op, id, serr)
	case info.Status == want:
		return nil
	default:
		return fmt.Errorf("%s %s: container is %s: %v: %w", op, id, info.Status, err, executor.ErrFailedPrecondition)
	}
}

// State implements executor.Executor.
func (e *Executor) State(ctx context.Context, id string) (executor.Info, error) {
	if err := checkID(id); err != nil {
		return executor.Info{}, fmt.Errorf("state: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return executor.Info{}, fmt.Errorf("state %s: %w", id, err)
	}
	return e.state(ctx, id)
}

func (e *Executor) state(ctx context.Context, id string) (executor.Info, error) {
	// Start makes the bundle before runc makes anything and Stop removes
	// it after runc deleted everything: without a bundle, runc knows
	// nothing of id, and asking it (a runc invocation, tens of
	// milliseconds) is what every activation would pay first.
	if _, err := os.Lstat(e.bundle(id)); errors.Is(err, fs.ErrNotExist) {
		return executor.Info{}, fmt.Errorf("container %s: %w", id, executor.ErrNotFound)
	}
	cctx, cancel := e.command(ctx)
	defer cancel()
	c, err := e.rc.State(cctx, id)
	if err == nil {
		return info(c), nil
	}
	if !strings.Contains(err.Error(), "does not exist") {
		return executor.Info{}, fmt.Errorf("state %s: runc state: %w", id, err)
	}
	rootfs, berr := bundleRootfs(e.bundle(id))
	if errors.Is(berr, fs.ErrNotExist) {
		return executor.Info{}, fmt.Errorf("container %s: %w", id, executor.ErrNotFound)
	}
	return executor.Info{ID: id, Status: executor.StatusAbsent, Rootfs: rootfs}, nil
}

// List implements executor.Executor.
func (e *Executor) List(ctx context.Context, prefix string) ([]executor.Info, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	// Bundles first: a Start between the two reads then shows up as a
	// runc container rather than as a bogus absent one.
	ents, err := os.ReadDir(e.bundles)
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	cctx, cancel := e.command(ctx)
	defer cancel()
	cs, err := e.rc.List(cctx)
	if err != nil {
		return nil, fmt.Errorf("list: runc list: %w", err)
	}
	var out []executor.Info
	seen := map[string]bool{}
	for _, c := range cs {
		if strings.HasPrefix(c.ID, prefix) {
			out = append(out, info(c))
			seen[c.ID] = true
		}
	}
	for _, d := range ents {
		id := d.Name()
		if seen[id] || !strings.HasPrefix(id, prefix) || checkID(id) != nil {
			continue
		}
		rootfs, _ := bundleRootfs(e.bundle(id))
		out = append(out, executor.Info{ID: id, Status: executor.StatusAbsent, Rootfs: rootfs})
	}
	slices.SortFunc(out, func(a, b executor.Info) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

func info(c *gorunc.Container) executor.Info {
	i := executor.Info{ID: c.ID, Status: executor.Status(c.Status), Rootfs: c.Rootfs, Created: c.Created}
	if i.Status == executor.StatusRunning || i.Status == executor.StatusPaused || i.Status == executor.StatusCreated {
		i.Pid = c.Pid
	}
	return i
}

// bundleRootfs reads the rootfs a bundle's container was started on.
func bundleRootfs(bundle string) (string, error) {
	var s struct {
		Root struct {
			Path string `json:"path"`
		} `json:"root"`
	}
	if err := readJSON(filepath.Join(bundle, "config.json"), &s); err != nil {
		return "", err
	}
	return s.Root.Path, nil
}

func writeJSON(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(name, b, 0o600)
}

func readJSON(name string, v any) error {
	b, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// runcMessage is the last error runc logged, or err when it logged none.
func runcMessage(logPath string, err error) string {
	f, ferr := os.Open(logPath)
	if ferr != nil {
		return err.Error()
	}
	defer f.Close()
	var last string
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		var l struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal(bytes.TrimSpace(sc.Bytes()), &l) == nil && (l.Level == "error" || l.Level == "fatal") {
			last = l.Msg
		}
	}
	if last == "" {
		return err.Error()
	}
	return last
}
