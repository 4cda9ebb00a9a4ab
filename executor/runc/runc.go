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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gorunc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

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
	// UserNS, if its Count is not zero, runs every container in a user
	// namespace whose ids 0..Count-1 are host ids Start..Start+Count-1: the
	// container's root is an unprivileged host user. The rootfs must show
	// its files with ids in that range (an idmapped delta, delta.IDMap),
	// and users of the container and of execs must lie inside it.
	UserNS IDRange
	// UserNSDir is where containers in a user namespace see their rootfs
	// from: runc mounts the rootfs as the namespace's root, which must be
	// able to walk to it, and the state dir is private. Each rootfs is
	// bind-mounted at UserNSDir/<Namespace>.<Start>/<id>; the directory for the
	// namespace is mode 0710 with the range's first id as its group, so no
	// other host user can walk into it. "/run/esf-userns" when empty.
	UserNSDir string
	// PoolSize is how many idle containers the executor keeps started for
	// Start to adopt (see the package doc); 0: none. SetPoolSize changes
	// it, ClosePool ends the pool.
	PoolSize int
	// Logger receives what the executor cannot return (a footprint it
	// could not remove). Discarded when nil.
	Logger *slog.Logger
}

// IDRange is a range of host ids.
type IDRange struct {
	Start, Count uint32
}

// host is in-container id k as a host id; k itself without a range.
func (r IDRange) host(k uint32) (uint32, error) {
	if r.Count == 0 {
		return k, nil
	}
	if k >= r.Count {
		return 0, fmt.Errorf("id %d outside the container's %d ids: %w", k, r.Count, executor.ErrInvalidArgument)
	}
	return r.Start + k, nil
}

func (o *Options) withDefaults() (Options, error) {
	v := *o
	if r := v.UserNS; r.Count > 0 && (r.Start == 0 || uint64(r.Start)+uint64(r.Count) > 1<<32-1) {
		return v, fmt.Errorf("runc executor: user namespace range %d:%d: want host ids above 0: %w", r.Start, r.Count, executor.ErrInvalidArgument)
	}
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
	if v.UserNSDir == "" {
		v.UserNSDir = "/run/esf-userns"
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
	// runcDeletes counts the Stops that left the container to runc
	// delete (stop.go; tests).
	runcDeletes atomic.Int64

	pool pool
}

var _ executor.Executor = (*Executor)(nil)

type idLock struct {
	mu   sync.Mutex
	refs int
}

// New checks opts and prepares the state dir. It runs nothing but the
// pool's first containers (Options.PoolSize), in the background.
func New(opts Options) (*Executor, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(o.StateDir, "runc")
	bundles := filepath.Join(o.StateDir, "bundles")
	for _, d := range []string{o.StateDir, root, bundles, filepath.Join(o.StateDir, stubsDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("runc executor: %w", err)
		}
	}
	e := &Executor{
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
		pool:    pool{size: o.PoolSize, limit: -1},
	}
	if o.PoolSize > 0 {
		e.poolAdjust()
	}
	return e, nil
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
	if strings.HasPrefix(id, poolPrefix) {
		return fmt.Errorf("start: container id %q: the prefix %s is the pool's: %w", id, poolPrefix, executor.ErrInvalidArgument)
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
	if _, err := os.Lstat(e.bundle(id)); err == nil {
		return fmt.Errorf("start %s: %w", id, executor.ErrExists)
	}
	// A Start that fails has no first exec to wait for: the refill its
	// adoption held back (takeIdle) may go.
	defer func() {
		if err != nil {
			e.poolWarmed(id)
		}
	}()
	if poolable(spec) {
		err := e.adopt(ctx, id, spec)
		if !errors.Is(err, errNoAdoption) {
			if err != nil {
				return fmt.Errorf("start %s: %w", id, err)
			}
			return nil
		}
	} else {
		e.poolEvict(ctx)
	}
	return e.startLocked(ctx, id, spec, false)
}

// startLocked starts container id on spec (the caller holds id's lock).
// With stub, it is a pool container: its root is an empty directory in
// its bundle, with the mountpoint adoption attaches a root at.
func (e *Executor) startLocked(ctx context.Context, id string, spec executor.Spec, stub bool) (err error) {
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
	if stub {
		if spec.Rootfs, err = e.makeStub(id); err != nil {
			return fmt.Errorf("start %s: %w", id, err)
		}
	}

	s, err := e.containerSpec(ctx, id, spec)
	if err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	if err := checkLeaves(spec.Rootfs, mountLeaves(s.Mounts)); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	if e.opts.UserNS.Count > 0 {
		p, err := e.bindRootfs(id, spec.Rootfs)
		if err != nil {
			return fmt.Errorf("start %s: %w", id, err)
		}
		s.Root.Path = p
		s.Annotations[annotationRootfs] = spec.Rootfs
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
	if !stub {
		e.spareAfterStart(id, s.Linux.CgroupsPath)
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
	e.poolWarmed(id)
	e.discardSpare(id)
	return e.stopLocked(ctx, id)
}

func (e *Executor) stopLocked(ctx context.Context, id string) error {
	cctx, cancel := e.command(ctx)
	defer cancel()
	rid := e.runcID(id)
	// The init is killed, its end awaited and the container removed
	// here, without runc (stop.go). Whatever that could not do, delete
	// --force does: it kills every process (thawing a frozen container
	// first), and it succeeds for an id runc does not know.
	if st, err := e.readState(rid); err != nil || !e.killInit(rid, st, e.opts.CommandTimeout) || e.removeStopped(rid, st) != nil {
		e.runcDeletes.Add(1)
		if err := e.rc.Delete(cctx, rid, &gorunc.DeleteOpts{Force: true}); err != nil {
			return fmt.Errorf("stop %s: runc delete: %w", id, err)
		}
	}
	if strings.HasPrefix(rid, poolPrefix) {
		if err := os.RemoveAll(e.stub(rid)); err != nil {
			return fmt.Errorf("stop %s: %w", id, err)
		}
	}
	if err := e.unbindRootfs(id); err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
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
	err = do(cctx, e.runcID(id))
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
	c, err := e.rc.State(cctx, e.runcID(id))
	if err == nil {
		return e.info(c, id), nil
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
	// Adopted pool containers go by their bundle's name, idle ones are
	// not listed.
	byRunc := map[string]string{}
	for _, d := range ents {
		if rid := e.runcID(d.Name()); rid != d.Name() {
			byRunc[rid] = d.Name()
		}
	}
	var out []executor.Info
	seen := map[string]bool{}
	for _, c := range cs {
		id := c.ID
		if a, ok := byRunc[id]; ok {
			id = a
		}
		if strings.HasPrefix(id, prefix) && !strings.HasPrefix(id, poolPrefix) {
			out = append(out, e.info(c, id))
			seen[id] = true
		}
	}
	for _, d := range ents {
		id := d.Name()
		if seen[id] || !strings.HasPrefix(id, prefix) || strings.HasPrefix(id, poolPrefix) || checkID(id) != nil {
			continue
		}
		rootfs, _ := bundleRootfs(e.bundle(id))
		out = append(out, executor.Info{ID: id, Status: executor.StatusAbsent, Rootfs: rootfs})
	}
	slices.SortFunc(out, func(a, b executor.Info) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// info describes c as container id, with the rootfs it was started on, not
// the path runc was given to it (bindRootfs, a pool container's stub).
func (e *Executor) info(c *gorunc.Container, id string) executor.Info {
	i := info(c)
	i.ID = id // an adopted pool container's runc id is the pool's
	if strings.HasPrefix(i.Rootfs, e.opts.UserNSDir+"/") || c.ID != id {
		if p, err := bundleRootfs(e.bundle(id)); err == nil {
			i.Rootfs = p
		}
	}
	return i
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
		Annotations map[string]string `json:"annotations"`
	}
	if err := readJSON(filepath.Join(bundle, "config.json"), &s); err != nil {
		return "", err
	}
	if p := s.Annotations[annotationRootfs]; p != "" {
		return p, nil // runc sees it through a bind mount (bindRootfs)
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

// userNSRootfs is where a container in a user namespace sees its rootfs.
// The directory is per namespace and range: two daemons of one namespace
// with different ranges each need theirs to be walkable by their own root.
func (e *Executor) userNSRootfs(id string) string {
	return filepath.Join(e.opts.UserNSDir, e.opts.Namespace+"."+strconv.FormatUint(uint64(e.opts.UserNS.Start), 10), id)
}

// bindRootfs bind-mounts rootfs where the user namespace's root can walk
// to it (Options.UserNSDir) and returns that path.
func (e *Executor) bindRootfs(id, rootfs string) (string, error) {
	dir := filepath.Dir(e.userNSRootfs(id))
	if err := os.MkdirAll(e.opts.UserNSDir, 0o711); err != nil {
		return "", err
	}
	if err := os.Mkdir(dir, 0o710); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	// Every time: a directory left by an older run may have other owners.
	if err := os.Chown(dir, 0, int(e.opts.UserNS.Start)); err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o710); err != nil {
		return "", err
	}
	p := e.userNSRootfs(id)
	if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	if err := unix.Mount(rootfs, p, "", unix.MS_BIND, ""); err != nil {
		os.Remove(p)
		return "", fmt.Errorf("bind rootfs: %w", err)
	}
	// Nothing runc mounts under it may propagate back to the host.
	if err := unix.Mount("", p, "", unix.MS_PRIVATE, ""); err != nil {
		unix.Unmount(p, unix.MNT_DETACH)
		os.Remove(p)
		return "", fmt.Errorf("bind rootfs: %w", err)
	}
	return p, nil
}

// unbindRootfs undoes bindRootfs; nothing to do when it was not made.
// The bind is where the bundle says runc saw the rootfs (an executor with
// another range, or none, may be the one stopping it: esfd stop-all), and
// where this executor would have put it (a start that failed before it
// wrote the bundle's config).
func (e *Executor) unbindRootfs(id string) error {
	paths := []string{e.userNSRootfs(id)}
	var c struct {
		Root struct {
			Path string `json:"path"`
		} `json:"root"`
	}
	if readJSON(filepath.Join(e.bundle(id), "config.json"), &c) == nil &&
		strings.HasPrefix(c.Root.Path, e.opts.UserNSDir+"/") && c.Root.Path != paths[0] {
		paths = append(paths, c.Root.Path)
	}
	for _, p := range paths {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := unix.Unmount(p, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", p, err)
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
