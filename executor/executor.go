package executor

import (
	"context"
	"fmt"
	"io"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/esf-dev/esf/errdefs"
)

// Error classes; test with errors.Is.
var (
	ErrNotFound           = errdefs.ErrNotFound
	ErrExists             = errdefs.ErrExists
	ErrInvalidArgument    = errdefs.ErrInvalidArgument
	ErrFailedPrecondition = errdefs.ErrFailedPrecondition
	ErrUnsupported        = errdefs.ErrUnsupported
)

// InitPath is where every container sees the worker's init, bind-mounted
// read-only: it is the container's PID 1, so images need no init of their own.
const InitPath = "/.esf/init"

// Footprint lists the paths an executor may create in a rootfs whatever the
// spec: the mountpoints of the kernel filesystems and of the init, made only
// when the image lacks them. They are mountpoints for the whole life of the
// container, so the sandbox can never change what lies beneath them, and a
// seal taken while the container runs keeps the parent's version of these
// paths (skips them in the delta). Absolute, sorted.
func Footprint() []string {
	return []string{"/.esf", "/dev", "/proc", "/run", "/sys"}
}

// Executor runs containers on directories. See the package documentation for
// the life cycle; every method is safe for concurrent use.
type Executor interface {
	// Start creates container id on spec.Rootfs and starts its init. It
	// returns once the container runs. A second Start of a live id is
	// ErrExists; a bad id or spec is ErrInvalidArgument. On error, nothing
	// of the container is left behind.
	Start(ctx context.Context, id string, spec Spec) error

	// Exec starts a process in the running container id and returns when
	// the process runs. A process that cannot start is an error here:
	// ErrInvalidArgument (no such executable, workdir, ...), ErrNotFound (no
	// such container), ErrFailedPrecondition (frozen or stopped).
	//
	// The process lives until it exits or ctx ends; then it and every
	// process it started (its session and its descendants) are killed and
	// Wait reports ctx.Err(). The caller must call Wait, which releases
	// everything Exec took; Exec's goroutines end before Wait returns.
	Exec(ctx context.Context, id string, spec ExecSpec) (Process, error)

	// Freeze stops every process of the container (cgroup freezer): what
	// the rootfs holds no longer changes until Thaw or Stop. Both are
	// idempotent. ErrNotFound for an unknown id, ErrFailedPrecondition for
	// a container that is not running.
	Freeze(ctx context.Context, id string) error
	Thaw(ctx context.Context, id string) error

	// Stop kills every process of the container, frozen or not (running
	// execs end; their Wait reports 137), deletes
	// it and everything the executor kept for it, and removes from the
	// rootfs the footprint Start created (when still empty). Stopping an
	// unknown id succeeds: Stop is also how leftovers of a crash are
	// removed.
	Stop(ctx context.Context, id string) error

	// State describes container id; ErrNotFound if the executor knows
	// nothing of it.
	State(ctx context.Context, id string) (Info, error)

	// List describes every container whose id starts with prefix,
	// including leftovers of a crashed daemon: a caller adopts the ones it
	// still wants (by using their ids) and Stops the others.
	List(ctx context.Context, prefix string) ([]Info, error)
}

// Process is a running Exec.
type Process interface {
	// Pid is the process's id in the host's pid namespace.
	Pid() int
	// Stdin is the process's standard input when ExecSpec.Stdin asked for
	// it, nil otherwise. Close it to send end-of-file (with a TTY, Close
	// sends nothing: the terminal's EOF character does that). Writes after
	// the process ended fail.
	Stdin() io.WriteCloser
	// Resize sets the terminal's window size; ErrFailedPrecondition
	// without a TTY.
	Resize(WinSize) error
	// Wait waits for the process to end and for its output to be
	// delivered, then releases its resources. Output ends when nothing
	// holds it: a background process that keeps stdout or stderr open
	// holds Wait until it exits or lets go (as with docker exec or ssh),
	// so daemons should redirect theirs. The code is the exit status,
	// 128+N when a signal N ended the process. err is nil whenever the
	// process ran and exited on its own, and wraps ctx.Err() when Exec's
	// context ended it (errdefs maps both to deadline_exceeded). Wait may
	// be called more than once; later calls return the same result.
	Wait() (code int, err error)
}

// OOMReporter is implemented by a Process that can tell, once Wait has
// returned, whether the kernel's OOM killer ended it (the container hit
// its memory limit) rather than some other SIGKILL.
type OOMReporter interface {
	OOMKilled() bool
}

// Usage is what a container has used, read from its cgroup.
type Usage struct {
	// CPUNanos is the CPU time its processes took since it started.
	CPUNanos uint64
	// MemoryBytes is the memory it holds now; MemoryLimit its limit (0:
	// none).
	MemoryBytes, MemoryLimit int64
}

// UsageReporter is implemented by an Executor that can read a running
// container's resource use (ErrNotFound for an unknown id).
type UsageReporter interface {
	Usage(ctx context.Context, id string) (Usage, error)
}

// PoolLimiter is implemented by an Executor that keeps idle containers
// started for activations to adopt (a warm pool). The daemon's live-attempt
// quota calls SetPoolLimit with the room it has left, so that idle
// containers never outnumber the attempts that could still start; n < 0
// lifts the cap (no quota).
type PoolLimiter interface {
	SetPoolLimit(n int)
}

// Spec describes a container.
type Spec struct {
	// Rootfs is the container's root: an existing directory, absolute,
	// used read-write as it is (the attempt's overlay root).
	Rootfs string
	// Env holds KEY=VALUE defaults for every exec, on top of a standard
	// PATH.
	Env []string
	// Workdir is the default working directory of execs ("/" when empty).
	// It must exist in the rootfs when an exec uses it.
	Workdir string
	// User is the default user of execs.
	User User
	// Limits bound the whole container (every exec shares them).
	Limits Limits
	// Mounts are extra bind mounts (e.g. a read-only view of the lower),
	// best placed under /.esf/ (see Footprint).
	Mounts []Mount
	// Hostname inside the container; "esf" when empty.
	Hostname string
	// CapAdd gives the container capabilities the executor drops by
	// default (DroppedCapabilities), e.g. "CAP_MKNOD". A policy's choice:
	// with them the sandbox can make files that carry privilege.
	CapAdd []string
}

// DroppedCapabilities are the capabilities an executor takes from the
// default set unless Spec.CapAdd gives them back: the ones that let the
// sandbox make files carrying privilege (setuid/setgid bits kept on a
// write or chown, file capabilities, device nodes).
func DroppedCapabilities() []string {
	return []string{"CAP_FSETID", "CAP_MKNOD", "CAP_SETFCAP"}
}

// Footprint is Footprint() plus the destinations of the extra mounts. A
// mount under /.esf/ (e.g. /.esf/lower) adds nothing; elsewhere the
// runtime also creates the destination's missing parents, which this list
// cannot know: put mounts under /.esf/ or where the image has the parent.
func (s Spec) Footprint() []string {
	fp := Footprint()
	for _, m := range s.Mounts {
		fp = append(fp, path.Clean(m.Destination))
	}
	slices.Sort(fp)
	return slices.Compact(fp)
}

// Validate reports the first problem of s as ErrInvalidArgument. It checks
// the form only; whether Rootfs exists is the implementation's business.
func (s Spec) Validate() error {
	if !path.IsAbs(s.Rootfs) {
		return fmt.Errorf("rootfs %q: want an absolute path: %w", s.Rootfs, ErrInvalidArgument)
	}
	if err := checkEnv(s.Env); err != nil {
		return err
	}
	if s.Workdir != "" && !path.IsAbs(s.Workdir) {
		return fmt.Errorf("workdir %q: want an absolute path: %w", s.Workdir, ErrInvalidArgument)
	}
	if err := s.Limits.Validate(); err != nil {
		return err
	}
	reserved := Footprint()
	for _, m := range s.Mounts {
		if !path.IsAbs(m.Source) {
			return fmt.Errorf("mount source %q: want an absolute path: %w", m.Source, ErrInvalidArgument)
		}
		d := path.Clean(m.Destination)
		if !path.IsAbs(d) || d == "/" {
			return fmt.Errorf("mount destination %q: want an absolute path below /: %w", m.Destination, ErrInvalidArgument)
		}
		for _, r := range reserved {
			if r == path.Dir(InitPath) {
				// /.esf/ takes the caller's mounts too, all but the init.
				r = InitPath
				if d == path.Dir(InitPath) {
					r = d
				}
			}
			if d == r || strings.HasPrefix(d, r+"/") {
				return fmt.Errorf("mount destination %q: %s is the executor's: %w", m.Destination, r, ErrInvalidArgument)
			}
		}
	}
	for _, c := range s.CapAdd {
		if !slices.Contains(DroppedCapabilities(), c) {
			return fmt.Errorf("capability %q: only %s can be added: %w", c, strings.Join(DroppedCapabilities(), ", "), ErrInvalidArgument)
		}
	}
	if strings.ContainsAny(s.Hostname, "/ \t\n\x00") || len(s.Hostname) > 64 {
		return fmt.Errorf("hostname %q: %w", s.Hostname, ErrInvalidArgument)
	}
	return nil
}

// Limits bound a container's resources; zero means unlimited.
type Limits struct {
	// MemoryBytes caps the container's memory; beyond it the kernel's
	// OOM killer ends a process of the container (exit 137).
	MemoryBytes int64
	// Pids caps how many processes and threads exist at once, init
	// included; fork fails beyond it.
	Pids int64
	// CPUs is the CPU time the container may use per wall second, in
	// CPUs (1.5 = one and a half), enforced by the CFS quota.
	CPUs float64
}

// The smallest limits a container starts and runs an exec under: runc's
// setup and the init already use about 2 MiB, and the init's threads count
// against the pids limit.
const (
	MinMemoryBytes = 8 << 20
	MinPids        = 16
)

// CPUPeriod is the CFS period Limits.CPUs is expressed against.
const CPUPeriod = 100 * time.Millisecond

// Validate reports a negative or unusable limit as ErrInvalidArgument.
func (l Limits) Validate() error {
	switch {
	case l.MemoryBytes < 0:
		return fmt.Errorf("memory limit %d: %w", l.MemoryBytes, ErrInvalidArgument)
	case l.MemoryBytes > 0 && l.MemoryBytes < MinMemoryBytes:
		return fmt.Errorf("memory limit %d: under the %d bytes a container needs to start: %w", l.MemoryBytes, MinMemoryBytes, ErrInvalidArgument)
	case l.Pids < 0:
		return fmt.Errorf("pids limit %d: %w", l.Pids, ErrInvalidArgument)
	case l.Pids > 0 && l.Pids < MinPids:
		return fmt.Errorf("pids limit %d: under the %d a container needs to run an exec: %w", l.Pids, MinPids, ErrInvalidArgument)
	case l.CPUs < 0 || math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0):
		return fmt.Errorf("cpus limit %v: %w", l.CPUs, ErrInvalidArgument)
	case l.CPUs > 0 && l.CPUQuota() < 1000:
		// The kernel refuses quotas under a millisecond.
		return fmt.Errorf("cpus limit %v: under 0.01: %w", l.CPUs, ErrInvalidArgument)
	}
	return nil
}

// CPUQuota is the CFS quota in microseconds per CPUPeriod; 0 without a limit.
func (l Limits) CPUQuota() int64 {
	return int64(math.Round(l.CPUs * float64(CPUPeriod.Microseconds())))
}

// Mount is a bind mount of a host path into the container.
type Mount struct {
	Source      string // absolute host path, file or directory
	Destination string // absolute path inside the container
	ReadOnly    bool
}

// User is a numeric identity inside the container; no name lookup, since
// target images need not have /etc/passwd.
type User struct {
	UID, GID uint32
}

// ParseUser reads "UID" or "UID:GID"; a missing GID is 0, as OCI runtimes
// do for a uid without a passwd entry.
func ParseUser(s string) (User, error) {
	us, gs, hasGID := strings.Cut(s, ":")
	uid, err := strconv.ParseUint(us, 10, 32)
	if err != nil {
		return User{}, fmt.Errorf("user %q: want UID or UID:GID: %w", s, ErrInvalidArgument)
	}
	var gid uint64
	if hasGID {
		if gid, err = strconv.ParseUint(gs, 10, 32); err != nil {
			return User{}, fmt.Errorf("user %q: want UID or UID:GID: %w", s, ErrInvalidArgument)
		}
	}
	return User{UID: uint32(uid), GID: uint32(gid)}, nil
}

func (u User) String() string {
	return fmt.Sprintf("%d:%d", u.UID, u.GID)
}

// ExecSpec describes one process to run in a container.
type ExecSpec struct {
	// Args is the command and its arguments; Args[0] is looked up in PATH.
	Args []string
	// Env holds KEY=VALUE entries on top of the container's; KEY alone
	// removes the container's KEY.
	Env []string
	// Workdir overrides the container's default; absolute.
	Workdir string
	// User overrides the container's default user.
	User *User
	// TTY runs the process on a new pseudo-terminal: its output (stdout
	// and stderr alike) goes to Stdout, Stdin writes to the terminal, and
	// Size is the initial window (0x0 leaves the kernel's default).
	TTY  bool
	Size WinSize
	// Stdin opens a pipe (or the terminal) the caller writes through
	// Process.Stdin; without it the process reads /dev/null.
	Stdin bool
	// Stdout and Stderr receive the output as it is produced; nil
	// discards it. They are written from goroutines of the executor, so
	// one writer given as both must be safe for concurrent use. Writes
	// may block (that backpressures the process) but must eventually
	// return: Wait waits for them. A writer that fails gets nothing more;
	// the process goes on.
	Stdout, Stderr io.Writer
}

// Validate reports the first problem of e as ErrInvalidArgument.
func (e ExecSpec) Validate() error {
	if len(e.Args) == 0 || e.Args[0] == "" {
		return fmt.Errorf("exec: no command: %w", ErrInvalidArgument)
	}
	for _, a := range e.Args {
		if strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("exec: argument with a NUL byte: %w", ErrInvalidArgument)
		}
	}
	if e.Workdir != "" && !path.IsAbs(e.Workdir) {
		return fmt.Errorf("exec: workdir %q: want an absolute path: %w", e.Workdir, ErrInvalidArgument)
	}
	for _, kv := range e.Env {
		// KEY alone unsets KEY, so only the key's form is checked here.
		k, _, _ := strings.Cut(kv, "=")
		if err := checkEnvKey(k, kv); err != nil {
			return err
		}
	}
	return nil
}

func checkEnv(env []string) error {
	for _, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("env %q: want KEY=VALUE: %w", kv, ErrInvalidArgument)
		}
		if err := checkEnvKey(k, kv); err != nil {
			return err
		}
	}
	return nil
}

func checkEnvKey(k, kv string) error {
	if k == "" || strings.IndexByte(kv, 0) >= 0 {
		return fmt.Errorf("env %q: want KEY=VALUE with a non-empty key and no NUL: %w", kv, ErrInvalidArgument)
	}
	return nil
}

// WinSize is a terminal window size in characters.
type WinSize struct {
	Rows, Cols uint16
}

// Status is a container's state.
type Status string

// The states a container is seen in. StatusAbsent is an id the executor
// holds files for but the runtime has no container: a Start that crashed
// half way; Stop removes it.
const (
	StatusCreated Status = "created"
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	StatusStopped Status = "stopped"
	StatusAbsent  Status = "absent"
)

// Info describes a container.
type Info struct {
	ID      string
	Status  Status
	Pid     int    // the init's pid on the host; 0 when not running
	Rootfs  string // the directory it was started on
	Created time.Time
}
