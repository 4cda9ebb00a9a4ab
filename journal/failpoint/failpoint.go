package failpoint

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/esf-dev/esf/errdefs"
)

// EnvVar names the environment variable read at startup.
const EnvVar = "ESF_FAILPOINTS"

// ErrInjected is wrapped by every error an "error" failpoint returns. It is
// an ErrUnavailable: to callers it looks like a transient fault.
var ErrInjected = fmt.Errorf("injected failure: %w", errdefs.ErrUnavailable)

type point struct {
	fire func() error
	from uint64 // fire on evaluation number >= from
	hits atomic.Uint64
}

var (
	armed    atomic.Bool
	mu       sync.Mutex
	points   atomic.Pointer[map[string]*point]
	declared = map[string]bool{}
	// envErr holds a malformed ESF_FAILPOINTS until Set replaces it.
	envErr atomic.Pointer[error]
)

func init() {
	if spec, ok := os.LookupEnv(EnvVar); ok {
		if err := Set(spec); err != nil {
			err = fmt.Errorf("%s: %w", EnvVar, err)
			envErr.Store(&err)
			armed.Store(true)
		}
	}
}

// Declare registers name so Names lists it, and returns it. Call it from a
// package-level var so every linked package's points are known at start.
func Declare(name string) string {
	mu.Lock()
	declared[name] = true
	mu.Unlock()
	return name
}

// Names lists every declared failpoint, sorted.
func Names() []string {
	mu.Lock()
	defer mu.Unlock()
	names := make([]string, 0, len(declared))
	for n := range declared {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Inject evaluates the failpoint name: nil unless it is armed and due, an
// error if its action returns one; the crash action does not return.
func Inject(name string) error {
	if !armed.Load() {
		return nil
	}
	if e := envErr.Load(); e != nil {
		return fmt.Errorf("failpoint %s: %w", name, *e)
	}
	m := points.Load()
	if m == nil {
		return nil
	}
	p := (*m)[name]
	if p == nil {
		return nil
	}
	if p.hits.Add(1) < p.from {
		return nil
	}
	if err := p.fire(); err != nil {
		return fmt.Errorf("failpoint %s: %w", name, err)
	}
	return nil
}

// Enable arms name to call fn on every evaluation (its error is returned by
// Inject) until the returned disable is called. Enabling an armed name
// replaces it.
func Enable(name string, fn func() error) (disable func()) {
	update(func(m map[string]*point) { m[name] = &point{fire: fn, from: 1} })
	return func() { update(func(m map[string]*point) { delete(m, name) }) }
}

// Set replaces every armed failpoint by those of spec (the ESF_FAILPOINTS
// syntax); an empty spec disarms all.
func Set(spec string) error {
	parsed := map[string]*point{}
	for _, entry := range strings.FieldsFunc(spec, func(r rune) bool { return r == ';' || r == ',' }) {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, action, ok := strings.Cut(entry, "=")
		if !ok || name == "" {
			return fmt.Errorf("failpoint entry %q: want name=action[@N]: %w", entry, errdefs.ErrInvalidArgument)
		}
		p := &point{from: 1}
		if a, n, ok := strings.Cut(action, "@"); ok {
			from, err := strconv.ParseUint(n, 10, 64)
			if err != nil || from == 0 {
				return fmt.Errorf("failpoint entry %q: count %q: %w", entry, n, errdefs.ErrInvalidArgument)
			}
			action, p.from = a, from
		}
		switch action {
		case "crash":
			p.fire = Crash
		case "error":
			p.fire = func() error { return ErrInjected }
		case "off":
			continue
		default:
			return fmt.Errorf("failpoint entry %q: unknown action %q (crash, error, off): %w", entry, action, errdefs.ErrInvalidArgument)
		}
		parsed[name] = p
	}
	envErr.Store(nil)
	update(func(m map[string]*point) {
		clear(m)
		for k, v := range parsed {
			m[k] = v
		}
	})
	return nil
}

// update swaps in a changed copy of the armed set, so Inject reads it
// without a lock.
func update(change func(map[string]*point)) {
	mu.Lock()
	defer mu.Unlock()
	m := map[string]*point{}
	if old := points.Load(); old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	change(m)
	points.Store(&m)
	armed.Store(len(m) > 0 || envErr.Load() != nil)
}

// Crash kills the calling process with SIGKILL and does not return.
func Crash() error {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	// Signal delivery to ourselves is immediate on Linux; block in case it
	// is not, so nothing after the failpoint can run.
	select {}
}
