package runc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
)

// The warm pool (see the package doc, "Pool"): idle containers started on
// an empty stub root, adopted by a Start whose spec they can serve.

const (
	// poolPrefix names the pool's containers; no caller's id starts so.
	poolPrefix = "esf-pool-"
	// stubsDir holds the pool containers' roots (stubs), by runc id:
	// not in the bundle, which adoption renames, while runc keeps
	// starting its exec processes in the root it was given. adoptDir is
	// the mountpoint in a stub where adoption attaches the caller's root.
	stubsDir = "pool"
	adoptDir = ".esf-adopt"
	// runcIDLink, in an adopted container's bundle, is a symlink whose
	// target is the id runc knows the container by.
	runcIDLink = "runc-id"
)

// maxPoolStarts bounds the refills under way at once: a runc run is
// mostly CPU, so many at once (an emptied pool of 16) take the CPUs from
// the activations' first commands and all finish late together; one per
// CPU makes the first replacement ready soonest. A Start that finds the
// pool empty meanwhile starts cold, as without a pool.
var maxPoolStarts = max(runtime.NumCPU(), 1)

// idleContainer is a started pool container: its init's pid, and a pidfd
// that proves the pid is still that init's.
type idleContainer struct {
	id    string
	pid   int
	pidfd int
	spare *spare // nil: none could be made
}

// close lets go of c's pidfd and spare (not of the container).
func (c *idleContainer) close() {
	unix.Close(c.pidfd)
	c.spare.close()
}

type pool struct {
	mu       sync.Mutex
	size     int // wanted idle containers (Options.PoolSize, SetPoolSize)
	limit    int // at most this many (SetPoolLimit); <0: no limit
	idle     []idleContainer
	starting int
	closed   bool
	swept    bool // leftovers of an earlier daemon removed
	sweeping bool // no container starts while they are
	wg       sync.WaitGroup
	adopted  int // Starts served from the pool (tests, metrics)
	// warming holds the adopted containers whose first exec has not
	// ended: a refill (a runc run, CPU-heavy) waits for them while the
	// pool still has an idle container, so that it does not slow down
	// the first command an activation is waiting for.
	warming map[string]bool
	// spares are the containers' spares until their first exec
	// (spare.go), an adopted container's or a cold one's.
	spares map[string]*pendingSpare
}

// target is how many idle containers the pool keeps now.
func (p *pool) targetLocked() int {
	if p.closed {
		return 0
	}
	n := p.size
	if p.limit >= 0 {
		n = min(n, p.limit)
	}
	return max(n, 0)
}

// SetPoolSize sets how many idle containers the executor keeps started
// for Start to adopt (0: none, the pool is off). Growing starts them in
// the background; shrinking stops the surplus in the background.
func (e *Executor) SetPoolSize(n int) {
	e.pool.mu.Lock()
	e.pool.size = n
	e.pool.mu.Unlock()
	e.poolAdjust()
}

// SetPoolLimit caps the pool below its size, n < 0 lifts the cap. The
// daemon's live-attempt quota gives the pool only the room it does not use
// (executor.PoolLimiter): an idle container never takes an attempt's
// place.
func (e *Executor) SetPoolLimit(n int) {
	e.pool.mu.Lock()
	e.pool.limit = n
	e.pool.mu.Unlock()
	e.poolAdjust()
}

// PoolIdle is how many idle containers are ready now.
func (e *Executor) PoolIdle() int {
	e.pool.mu.Lock()
	defer e.pool.mu.Unlock()
	return len(e.pool.idle)
}

// ClosePool stops every idle container and waits for the pool's
// background work; the pool stays off. Adopted containers are the
// callers' and stay. Idle containers an earlier daemon left (a crash) go
// too, if the pool never ran (esfd stop-all).
func (e *Executor) ClosePool(ctx context.Context) error {
	p := &e.pool
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	sweep := !p.swept
	p.swept = true
	p.mu.Unlock()
	p.wg.Wait()
	if sweep {
		e.sweepPool()
	}
	var errs []error
	for _, c := range idle {
		c.close()
		errs = append(errs, e.Stop(context.WithoutCancel(ctx), c.id))
	}
	// Something started meanwhile (a refill that was under way) was
	// queued as idle after the swap above.
	p.mu.Lock()
	idle = p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		c.close()
		errs = append(errs, e.Stop(context.WithoutCancel(ctx), c.id))
	}
	return errors.Join(errs...)
}

// poolAdjust starts or stops idle containers towards the target.
func (e *Executor) poolAdjust() {
	p := &e.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if p.sweeping {
		return // the sweep adjusts when it is done
	}
	// Whatever the size: a daemon restarted with its pool off must not
	// leave the idle containers of the one that crashed running, outside
	// its quota, for its whole life.
	if !p.swept {
		p.swept, p.sweeping = true, true
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			e.sweepPool()
			p.mu.Lock()
			p.sweeping = false
			p.mu.Unlock()
			e.poolAdjust()
		}()
		return
	}
	t := p.targetLocked()
	for len(p.idle)+p.starting < t && (len(p.warming) == 0 || len(p.idle) == 0) && p.starting < maxPoolStarts {
		p.starting++
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			e.poolStartOne()
		}()
	}
	for len(p.idle) > t {
		c := p.idle[0]
		p.idle = p.idle[1:]
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			c.close()
			if err := e.Stop(context.Background(), c.id); err != nil {
				e.opts.Logger.Warn("runc executor: stop idle pool container", "id", c.id, "err", err)
			}
		}()
	}
}

// sweepPool stops the pool containers an earlier daemon left (a crash):
// every bundle named like one, since those of this executor are not
// started yet.
func (e *Executor) sweepPool() {
	ents, err := os.ReadDir(e.bundles)
	if err != nil {
		return
	}
	for _, d := range ents {
		if strings.HasPrefix(d.Name(), poolPrefix) {
			if err := e.Stop(context.Background(), d.Name()); err != nil {
				e.opts.Logger.Warn("runc executor: stop leftover pool container", "id", d.Name(), "err", err)
			}
		}
	}
}

func (e *Executor) poolStartOne() {
	p := &e.pool
	var b [8]byte
	rand.Read(b[:])
	id := poolPrefix + hex.EncodeToString(b[:])
	c, err := e.startPooled(context.Background(), id)
	p.mu.Lock()
	p.starting--
	keep := err == nil && !p.closed && len(p.idle) < p.targetLocked()
	if keep {
		p.idle = append(p.idle, c)
	}
	p.mu.Unlock()
	if err != nil {
		// Not retried at once: the next Start that finds the pool empty
		// asks again.
		e.opts.Logger.Warn("runc executor: start pool container", "err", err)
		return
	}
	if !keep {
		c.close()
		if err := e.Stop(context.Background(), id); err != nil {
			e.opts.Logger.Warn("runc executor: stop surplus pool container", "id", id, "err", err)
		}
		return
	}
	e.poolAdjust() // the next refill, if maxPoolStarts held it back
}

// startPooled starts an idle container on a stub root in its bundle: the
// spec every Start gets, with no limits, env or mounts (adoption sets
// those).
func (e *Executor) startPooled(ctx context.Context, id string) (idleContainer, error) {
	unlock := e.lock(id)
	defer unlock()
	c := idleContainer{id: id, pidfd: -1}
	if err := e.startLocked(ctx, id, executor.Spec{}, true); err != nil {
		return c, err
	}
	var err error
	if c.pid, c.pidfd, err = e.initPidfd(id); err != nil {
		if serr := e.stopLocked(ctx, id); serr != nil {
			e.opts.Logger.Warn("runc executor: stop pool container", "id", id, "err", serr)
		}
		return c, err
	}
	e.makeIdleSpare(&c)
	return c, nil
}

func (e *Executor) stub(runcID string) string {
	return filepath.Join(e.opts.StateDir, stubsDir, runcID)
}

// makeStub makes the root of pool container id: empty but for adoptDir,
// owned by the user namespace's root when there is one.
func (e *Executor) makeStub(id string) (string, error) {
	dir := e.stub(id)
	if err := os.MkdirAll(filepath.Join(dir, adoptDir), 0o755); err != nil {
		return "", err
	}
	if r := e.opts.UserNS; r.Count > 0 {
		for _, p := range []string{dir, filepath.Join(dir, adoptDir)} {
			if err := os.Chown(p, int(r.Start), int(r.Start)); err != nil {
				return "", err
			}
		}
	}
	return dir, nil
}

// takeIdle hands out an idle container for container id, and asks for
// its replacement. The replacement waits for id's first exec (or its
// Stop, or the Start's failure: poolWarmed) while another container is
// idle: marked warming before the pool adjusts, so that no refill starts
// beside the adoption and the first command.
func (e *Executor) takeIdle(id string) (idleContainer, bool) {
	p := &e.pool
	p.mu.Lock()
	// The Start takes the room as a live container, adopted or cold; the
	// quota's next word (SetPoolLimit) says the same. Taken even when no
	// container is idle: a refill under way then finds no room when it is
	// ready, instead of idling beside the cold start.
	if p.limit > 0 {
		p.limit--
	}
	if len(p.idle) == 0 {
		p.mu.Unlock()
		e.poolAdjust()
		return idleContainer{}, false
	}
	c := p.idle[len(p.idle)-1]
	p.idle = p.idle[:len(p.idle)-1]
	if p.warming == nil {
		p.warming = map[string]bool{}
	}
	p.warming[id] = true
	p.mu.Unlock()
	e.poolAdjust()
	return c, true
}

// poolEvict makes room for a Start the pool cannot serve: its idle
// containers fill the room the quota left (SetPoolLimit), and a cold start
// beside a full pool would hold one container more than --max-attempts
// until the quota's next word. It takes the Start's place from the limit,
// as takeIdle does, and stops the idle containers beyond it before the
// Start runs runc. The caller holds the Start's id lock (never a pool
// container's: those are locked after, as adopt does).
func (e *Executor) poolEvict(ctx context.Context) {
	p := &e.pool
	p.mu.Lock()
	if p.limit > 0 {
		p.limit--
	}
	var out []idleContainer
	for t := p.targetLocked(); len(p.idle) > t; {
		out = append(out, p.idle[0])
		p.idle = p.idle[1:]
	}
	p.mu.Unlock()
	for _, c := range out {
		c.close()
		if err := e.Stop(context.WithoutCancel(ctx), c.id); err != nil {
			e.opts.Logger.Warn("runc executor: evict idle pool container", "id", c.id, "err", err)
		}
	}
}

// poolable reports whether an idle container can become spec's: its init
// runs as root with the default capabilities (adoption cannot change the
// init's credentials).
func poolable(spec executor.Spec) bool {
	return spec.User == (executor.User{}) && len(spec.CapAdd) == 0
}

// runcID is the id runc knows container id by: the pool container's for
// an adopted one, id itself otherwise.
func (e *Executor) runcID(id string) string {
	if t, err := os.Readlink(filepath.Join(e.bundle(id), runcIDLink)); err == nil && checkID(t) == nil {
		return t
	}
	return id
}

// errNoAdoption: the pool could not serve this Start; start cold.
var errNoAdoption = errors.New("no pool container")

// adopt makes an idle pool container container id on spec: it attaches
// spec.Rootfs (and spec.Mounts) in the container's mount namespace, moves
// the kernel file systems and the init under it, pivots the namespace's
// root there, sets the cgroup limits, the hostname and the bundle's
// config, and renames the bundle to id. errNoAdoption means nothing was
// done with id and a cold start should follow. The caller holds id's lock.
func (e *Executor) adopt(ctx context.Context, id string, spec executor.Spec) (err error) {
	c, ok := e.takeIdle(id)
	if !ok {
		return errNoAdoption
	}
	pid := c.id
	returned := false
	defer func() {
		if !returned {
			c.close()
		}
	}()
	unlock := e.lock(pid)
	defer unlock()
	pbundle := e.bundle(pid)
	discard := true
	defer func() {
		if discard {
			if serr := e.stopLocked(ctx, pid); serr != nil {
				e.opts.Logger.Warn("runc executor: discard pool container", "id", pid, "err", serr)
			}
		}
	}()
	var ps specs.Spec
	if err := readJSON(filepath.Join(pbundle, "config.json"), &ps); err != nil {
		e.opts.Logger.Warn("runc executor: pool container", "id", pid, "err", err)
		return errNoAdoption
	}

	s, err := e.containerSpec(ctx, id, spec)
	if err != nil {
		return err
	}
	leaves := mountLeaves(s.Mounts)
	if err := checkLeaves(spec.Rootfs, leaves); err != nil {
		discard, returned = false, true
		e.poolReturn(c)
		return err
	}
	created, err := absentFootprint(spec.Rootfs, leaves)
	if err != nil {
		discard, returned = false, true
		e.poolReturn(c)
		return err
	}
	if err := e.switchTo(pbundle, pid, c, &ps, s, spec, leaves, created); err != nil {
		// The pool container is discarded (and with it the footprint
		// made in spec.Rootfs); the Start goes on cold.
		e.opts.Logger.Warn("runc executor: adoption failed, starting cold", "id", id, "pool", pid, "err", err)
		return errNoAdoption
	}
	if err := unix.Renameat2(unix.AT_FDCWD, pbundle, unix.AT_FDCWD, e.bundle(id), unix.RENAME_NOREPLACE); err != nil {
		e.opts.Logger.Warn("runc executor: adoption failed, starting cold", "id", id, "pool", pid, "err", err)
		return errNoAdoption
	}
	discard = false
	e.keepSpare(id, c.spare)
	c.spare = nil
	e.pool.mu.Lock()
	e.pool.adopted++
	e.pool.mu.Unlock()
	return nil
}

// poolWarmed notes that an adopted container ran its first exec (or
// stopped): the refill it held back may start.
func (e *Executor) poolWarmed(id string) {
	p := &e.pool
	p.mu.Lock()
	held := p.warming[id]
	delete(p.warming, id)
	p.mu.Unlock()
	if held {
		e.poolAdjust()
	}
}

// switchTo does the work of adopt once the caller's spec s passed its
// checks: pool container pid (in pbundle, on config ps) becomes s.
func (e *Executor) switchTo(pbundle, pid string, c idleContainer, ps *specs.Spec, s *specs.Spec, spec executor.Spec, leaves []string, created []footprintEntry) error {
	// The bundle says from here on that it serves spec.Rootfs, with the
	// footprint made there: a failure (or a crash) below removes it.
	s.Root.Path = ps.Root.Path
	s.Linux.CgroupsPath = ps.Linux.CgroupsPath
	s.Annotations[annotationRootfs] = spec.Rootfs
	if err := writeJSON(filepath.Join(pbundle, "config.json"), s); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(pbundle, footprintFile), created); err != nil {
		return err
	}
	var mk []leaf
	for _, m := range s.Mounts {
		if !slices.Contains(leaves, m.Destination) {
			continue
		}
		file := false
		if m.Type == "bind" {
			if fi, err := os.Stat(m.Source); err == nil && !fi.IsDir() {
				file = true
			}
		}
		mk = append(mk, leaf{m.Destination, file})
	}
	if err := e.makeLeaves(spec.Rootfs, mk); err != nil {
		return err
	}
	var binds []bindMount
	for _, m := range spec.Mounts {
		binds = append(binds, bindMount{src: m.Source, dst: m.Destination, ro: m.ReadOnly})
	}
	hostname := spec.Hostname
	if hostname == "" {
		hostname = defaultHostname
	}
	if err := switchRoot(c.pid, c.pidfd, spec.Rootfs, binds, hostname); err != nil {
		return err
	}
	if err := setLimits(ps.Linux.CgroupsPath, spec.Limits); err != nil {
		return err
	}
	if err := os.Symlink(pid, filepath.Join(pbundle, runcIDLink)); err != nil {
		return err
	}
	return nil
}

// poolReturn gives back an idle container that adoption did not touch.
// The caller holds c's lock.
func (e *Executor) poolReturn(c idleContainer) {
	p := &e.pool
	p.mu.Lock()
	if !p.closed {
		p.idle = append(p.idle, c)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	c.close()
	if err := e.stopLocked(context.Background(), c.id); err != nil {
		e.opts.Logger.Warn("runc executor: stop pool container", "id", c.id, "err", err)
	}
}

type bindMount struct {
	src, dst string
	ro       bool
}

type leaf struct {
	path string
	file bool
}

// makeLeaves creates the mountpoints in rootfs that runc would have made
// there, as runc would: as the container's root, which in a user
// namespace is a host id of the range (an idmapped root refuses host
// root's writes, EOVERFLOW). The fs ids are per thread: a locked thread
// takes them and gives them back before it is unlocked, or dies.
func (e *Executor) makeLeaves(rootfs string, leaves []leaf) error {
	if len(leaves) == 0 {
		return nil
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer unix.Close(root)
		if r := e.opts.UserNS; r.Count > 0 {
			if err := unix.Setfsgid(int(r.Start)); err != nil {
				done <- err // the thread dies: its fs ids are unknown
				return
			}
			if err := unix.Setfsuid(int(r.Start)); err != nil {
				done <- err
				return
			}
		}
		for _, l := range leaves {
			if err = makeLeaf(root, l.path, l.file); err != nil {
				err = fmt.Errorf("mountpoint %s: %w", l.path, err)
				break
			}
		}
		if r := e.opts.UserNS; r.Count > 0 {
			// Back to root: the file system capabilities come back with
			// fsuid 0 (capabilities(7)).
			if unix.Setfsuid(0) != nil || unix.Setfsgid(0) != nil {
				done <- err
				return
			}
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}

// makeLeaf creates the mountpoint leaf below root, with its missing
// parents, never following a symlink (checkLeaves refused those; this
// refuses one made since).
func makeLeaf(root int, leaf string, file bool) error {
	dir, err := unix.Dup(root)
	if err != nil {
		return err
	}
	defer func() { unix.Close(dir) }()
	comps := components(leaf)
	for i, c := range comps {
		last := i == len(comps)-1
		if last && file {
			fd, err := unix.Openat(dir, c, unix.O_CREAT|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return err
			}
			return unix.Close(fd)
		}
		if err := unix.Mkdirat(dir, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		next, err := unix.Openat(dir, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		unix.Close(dir)
		dir = next
	}
	return nil
}

// topMounts are the mountpoints, as the container sees them, of the
// mounts right below its root: what runc mounted into the stub (proc,
// dev, sys, the init, ...) with everything mounted below them.
func topMounts(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "mountinfo"))
	if err != nil {
		return nil, err
	}
	type ent struct{ id, parent, point string }
	var ents []ent
	rootID := ""
	for l := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 {
			continue
		}
		ents = append(ents, ent{f[0], f[1], unescapeMount(f[4])})
		if f[4] == "/" {
			rootID = f[0] // the last mount on "/" is the root
		}
	}
	if rootID == "" {
		return nil, errors.New("no root in the container's mountinfo")
	}
	var out []string
	for _, m := range ents {
		if m.parent == rootID && m.id != rootID && m.point != "/"+adoptDir {
			out = append(out, m.point)
		}
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// switchRoot makes rootfs the root of the mount namespace of process pid
// (a pool container's init): it clones rootfs's mount (not its submounts)
// and the binds' sources on the host, then, on a thread of its own that
// joined the container's mount namespace, attaches the clone at the stub's
// adoptDir, moves every mount below the stub's root (proc, dev, sys, the
// init, with their submounts: masked paths, /dev/pts...) to the same place
// under it, attaches the binds, and pivots the namespace's root to it,
// which moves the root and working directory of every process whose were
// the stub's (the init's) and detaches the stub. The thread dies with the
// goroutine: it is never handed back to the Go scheduler.
func switchRoot(pid, pidfd int, rootfs string, binds []bindMount, hostname string) error {
	tops, err := topMounts(pid)
	if err != nil {
		return err
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	rootTree, err := unix.OpenTree(unix.AT_FDCWD, rootfs, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("clone %s: %w", rootfs, err)
	}
	fds = append(fds, rootTree)
	bindTrees := make([]int, len(binds))
	for i, m := range binds {
		fd, err := unix.OpenTree(unix.AT_FDCWD, m.src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return fmt.Errorf("clone %s: %w", m.src, err)
		}
		fds = append(fds, fd)
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if m.ro {
			attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
			return fmt.Errorf("bind %s: %w", m.src, err)
		}
		bindTrees[i] = fd
	}
	mntNS, err := unix.Open(filepath.Join("/proc", strconv.Itoa(pid), "ns", "mnt"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	fds = append(fds, mntNS)
	utsNS, err := unix.Open(filepath.Join("/proc", strconv.Itoa(pid), "ns", "uts"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	fds = append(fds, utsNS)
	// The pid was the init's when these were opened if the init is
	// still alive now (a pid is not reused while its process lives).
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return fmt.Errorf("pool container's init: %w", err)
	}

	// The thread's own namespaces, to go back to: a locked thread that
	// ends with its goroutine is terminated, but the main thread is only
	// parked forever, and one parked in the container's namespace would
	// pin it (its root: the attempt's overlay, and the projection below
	// it) for the daemon's life.
	ownMnt, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	fds = append(fds, ownMnt)
	ownUTS, err := unix.Open("/proc/thread-self/ns/uts", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	fds = append(fds, ownUTS)

	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread has left the daemon's fs
		// struct, so it must end with this goroutine; before that it
		// goes back to the daemon's namespaces (see ownMnt).
		err := func() error {
			// setns into a mount namespace wants a thread that shares
			// its fs (root, cwd) with no other.
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return fmt.Errorf("unshare fs: %w", err)
			}
			if err := unix.Setns(mntNS, unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("join mount namespace: %w", err)
			}
			if err := unix.Chdir("/"); err != nil {
				return err
			}
			if err := unix.MoveMount(rootTree, "", unix.AT_FDCWD, "/"+adoptDir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return fmt.Errorf("attach root: %w", err)
			}
			newRoot, err := unix.Open("/"+adoptDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(newRoot)
			beneath := func(p string) (int, error) {
				return unix.Openat2(newRoot, strings.TrimPrefix(p, "/"), &unix.OpenHow{
					Flags:   unix.O_PATH | unix.O_CLOEXEC,
					Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
				})
			}
			for _, p := range tops {
				t, err := beneath(p)
				if err != nil {
					return fmt.Errorf("mountpoint %s: %w", p, err)
				}
				err = unix.MoveMount(unix.AT_FDCWD, p, t, "", unix.MOVE_MOUNT_T_EMPTY_PATH)
				unix.Close(t)
				if err != nil {
					return fmt.Errorf("move %s: %w", p, err)
				}
			}
			for i, m := range binds {
				t, err := beneath(m.dst)
				if err != nil {
					return fmt.Errorf("mountpoint %s: %w", m.dst, err)
				}
				err = unix.MoveMount(bindTrees[i], "", t, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
				unix.Close(t)
				if err != nil {
					return fmt.Errorf("bind %s: %w", m.dst, err)
				}
			}
			// As runc does: pivot onto itself, the old root then lies on
			// top and is detached; made a slave first so that its
			// unmount cannot propagate anywhere.
			if err := unix.Fchdir(newRoot); err != nil {
				return err
			}
			if err := unix.PivotRoot(".", "."); err != nil {
				return fmt.Errorf("pivot_root: %w", err)
			}
			if err := unix.Mount("", ".", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
				return fmt.Errorf("old root: %w", err)
			}
			if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
				return fmt.Errorf("detach old root: %w", err)
			}
			if hostname != defaultHostname {
				if err := unix.Setns(utsNS, unix.CLONE_NEWUTS); err != nil {
					return fmt.Errorf("join uts namespace: %w", err)
				}
				if err := unix.Sethostname([]byte(hostname)); err != nil {
					return fmt.Errorf("hostname: %w", err)
				}
			}
			return nil
		}()
		if berr := unix.Setns(ownUTS, unix.CLONE_NEWUTS); berr != nil {
			err = errors.Join(err, fmt.Errorf("back to the daemon's uts namespace: %w", berr))
		}
		if berr := unix.Setns(ownMnt, unix.CLONE_NEWNS); berr != nil {
			err = errors.Join(err, fmt.Errorf("back to the daemon's mount namespace: %w", berr))
		}
		done <- err
	}()
	err = <-done
	return err
}

// setLimits writes limits into the cgroup at cgroupsPath (v1 or v2), as
// runc would have at the container's start: a pool container starts
// without any.
func setLimits(cgroupsPath string, l executor.Limits) error {
	type file struct{ path, value string }
	var fs []file
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		dir := filepath.Join("/sys/fs/cgroup", cgroupsPath)
		if l.MemoryBytes > 0 {
			fs = append(fs, file{filepath.Join(dir, "memory.max"), strconv.FormatInt(l.MemoryBytes, 10)})
		}
		if l.Pids > 0 {
			fs = append(fs, file{filepath.Join(dir, "pids.max"), strconv.FormatInt(l.Pids, 10)})
		}
		if l.CPUs > 0 {
			fs = append(fs, file{filepath.Join(dir, "cpu.max"), fmt.Sprintf("%d %d", l.CPUQuota(), executor.CPUPeriod.Microseconds())})
		}
	} else {
		if l.MemoryBytes > 0 {
			fs = append(fs, file{filepath.Join("/sys/fs/cgroup/memory", cgroupsPath, "memory.limit_in_bytes"), strconv.FormatInt(l.MemoryBytes, 10)})
		}
		if l.Pids > 0 {
			fs = append(fs, file{filepath.Join("/sys/fs/cgroup/pids", cgroupsPath, "pids.max"), strconv.FormatInt(l.Pids, 10)})
		}
		if l.CPUs > 0 {
			dir := filepath.Join("/sys/fs/cgroup/cpu", cgroupsPath)
			fs = append(fs, file{filepath.Join(dir, "cpu.cfs_period_us"), strconv.FormatInt(executor.CPUPeriod.Microseconds(), 10)},
				file{filepath.Join(dir, "cpu.cfs_quota_us"), strconv.FormatInt(l.CPUQuota(), 10)})
		}
	}
	for _, f := range fs {
		if err := os.WriteFile(f.path, []byte(f.value), 0); err != nil {
			return fmt.Errorf("cgroup limit: %w", err)
		}
	}
	return nil
}

// PoolAdopted is how many Starts the pool served so far.
func (e *Executor) PoolAdopted() int {
	e.pool.mu.Lock()
	defer e.pool.mu.Unlock()
	return e.pool.adopted
}

// RuncID is the id runc knows container id by (its cgroup is
// /<Namespace>/<RuncID>): a pool container's for an adopted one.
func (e *Executor) RuncID(id string) string { return e.runcID(id) }
