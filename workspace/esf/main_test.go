package esf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/testenv"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/workspace"
)

// One real daemon serves every test of the package: an in-process fabric
// with the runc executor and its API on a unix socket, as esfd wires them
// (the FUSE projection in-process, as the fabric's own runc tests do), and
// a busybox-static rootfs imported once. Each test gets a provider of its
// own namespace, so sessions of different tests never meet.
var (
	skipReason string
	testD      *daemon
)

type daemon struct {
	dir    string
	f      *fabric.Fabric
	ex     *runc.Executor
	socket string
	c      *client.Client
	image  string // the busybox root id
	stop   func() error
}

const cgroupNS = "esf-ws-test"

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	if err := precondition(); err != nil {
		skipReason = err.Error()
		return m.Run()
	}
	d, err := startDaemon()
	if err != nil {
		fmt.Fprintf(os.Stderr, "workspace/esf: start the test daemon: %v\n", err)
		return 1
	}
	testD = d
	code := m.Run()
	if err := d.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "workspace/esf: teardown: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// needs names what the real thing needs (internal/testenv): CI has root,
// runc, busybox-static, overlayfs and /dev/fuse.
var needs = append([]string{"fuse", "overlay"}, runctest.Needs...)

// precondition says why the real thing cannot run here.
func precondition() error { return testenv.Check(needs...) }

// stateBase is a directory with room for the large-file test (its bytes
// land in the attempt's upper directory under the state dir).
func stateBase() string {
	for _, d := range []string{os.TempDir(), "/var/tmp"} {
		var st unix.Statfs_t
		if unix.Statfs(d, &st) == nil && int64(st.Bavail)*int64(st.Bsize) > 4<<30 {
			return d
		}
	}
	return os.TempDir()
}

func startDaemon() (_ *daemon, err error) {
	dir, err := os.MkdirTemp(stateBase(), "esf-ws-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	initBin, err := runctest.BuildInit(dir)
	if err != nil {
		return nil, err
	}
	ex, err := runc.New(runc.Options{StateDir: filepath.Join(dir, "runc"), Init: initBin, Namespace: cgroupNS})
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	f, err := fabric.Open(ctx, fabric.Options{StateDir: filepath.Join(dir, "state"), Executor: ex})
	if err != nil {
		return nil, err
	}
	d := &daemon{dir: dir, f: f, ex: ex, socket: filepath.Join(dir, "esfd.sock")}
	ln, err := api.Listen(d.socket)
	if err != nil {
		f.StopAll(ctx)
		f.Close()
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { api.NewServer(f, api.ServerOptions{}).Serve(sctx, ln, time.Second) })
	// The lease reaper of esfd.
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				f.ExpireLeases(sctx)
			}
		}
	})
	d.stop = func() error {
		cancel()
		wg.Wait()
		d.c.Close()
		err := f.StopAll(context.Background())
		f.Close()
		left, _ := ex.List(context.Background(), "")
		runctest.RemoveCgroupParents(cgroupNS)
		if len(left) > 0 {
			err = errors.Join(err, fmt.Errorf("containers left: %+v", left))
		}
		return errors.Join(err, os.RemoveAll(dir))
	}
	d.c = client.NewClient(d.socket)
	rootfs := filepath.Join(dir, "busybox")
	if err := runctest.Busybox(rootfs); err != nil {
		d.stop()
		return nil, err
	}
	if err := addPrintenv(rootfs); err != nil {
		d.stop()
		return nil, err
	}
	imp, err := d.c.Import(ctx, rootfs, client.CallOptions{})
	if err != nil {
		d.stop()
		return nil, err
	}
	d.image = imp.RootID.String()
	return d, nil
}

// addPrintenv gives the image a printenv when busybox has none (Debian's
// busybox-static lacks the applet; the conformance suite uses it).
func addPrintenv(rootfs string) error {
	p := filepath.Join(rootfs, "bin", "printenv")
	if _, err := os.Lstat(p); err == nil {
		return nil
	}
	const script = `#!/bin/sh
[ $# -eq 0 ] && exec env
for n in "$@"; do
	eval "[ \"\${$n+set}\" = set ]" || exit 1
	eval "printf '%s\n' \"\$$n\""
done
`
	return os.WriteFile(p, []byte(script), 0o755)
}

var nsSeq atomic.Int64

// newProvider returns a provider of a namespace of its own on the test
// daemon. When the test ends, no session of it may be left, and none of
// its attempts may still have a container.
func newProvider(t *testing.T, tweak ...func(*Options)) *Provider {
	t.Helper()
	if skipReason != "" {
		testenv.Require(t, needs...) // skips, or fails in CI
		t.Fatal("workspace/esf needs a real esfd with runc: " + skipReason)
	}
	o := Options{Client: testD.c, Image: testD.image, Namespace: fmt.Sprintf("%s-%d", t.Name(), nsSeq.Add(1)),
		MemoryBytes: 512 << 20, Pids: 256}
	for _, fn := range tweak {
		fn(&o)
	}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		infos, err := p.Sessions(ctx)
		if err != nil {
			t.Errorf("sessions at the end: %v", err)
		}
		for _, in := range infos {
			t.Errorf("session %s left open (paused %v)", in.ID, in.Paused)
			if s, err := p.Attach(ctx, in.ID); err == nil {
				s.Close(ctx)
			}
		}
		p.Close()
	})
	return p
}

// create makes a session that is closed when the test ends.
func create(t *testing.T, p *Provider, spec workspace.Spec) *Session {
	t.Helper()
	s, err := p.Create(t.Context(), spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s.(*Session)
}

// attemptOf is the id of the handle's live attempt ("" when paused).
func attemptOf(s *Session) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.att == nil {
		return ""
	}
	return s.att.id
}

// containers lists the runc containers of attempt (all when "").
func containers(t *testing.T, attempt string) []string {
	t.Helper()
	infos, err := testD.ex.List(context.Background(), attempt)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range infos {
		ids = append(ids, in.ID+"("+string(in.Status)+")")
	}
	return ids
}

// attemptState reads an attempt's state from the daemon.
func attemptState(t *testing.T, id string) v1.AttemptState {
	t.Helper()
	in, err := testD.c.Inspect(context.Background(), id, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return in.Attempt.State
}

// liveAttempts lists every live attempt of the daemon.
func liveAttempts(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
	var live []string
	err := testD.c.Events(ctx, v1.EventsQuery{Types: []string{journal.EventAttemptCreated}}, func(ev v1.Event) error {
		in, err := testD.c.Inspect(ctx, ev.AttemptID, client.CallOptions{})
		if err != nil {
			return err
		}
		if in.Attempt.State.Live() {
			live = append(live, ev.AttemptID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return live
}

// processes lists the command lines running in attempt's container, the
// container's init excluded (runc ps against the executor's runc root).
func processes(t *testing.T, attempt string) []string {
	t.Helper()
	out, err := exec.Command("runc", "--root", testD.ex.Root(), "ps", attempt, "-o", "pid,args").CombinedOutput()
	if err != nil {
		t.Errorf("runc ps %s: %v\n%s", attempt, err, out) // not Fatal: called from goroutines too
		return nil
	}
	var procs []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n")[1:] {
		if f := strings.Fields(l); len(f) > 1 && !strings.Contains(l, "esf-init") && !strings.Contains(l, "/.esf/") {
			procs = append(procs, strings.Join(f[1:], " "))
		}
	}
	return procs
}

// noLeaks fails the test if the daemon holds any live attempt or container.
func noLeaks(t *testing.T) {
	t.Helper()
	if live := liveAttempts(t); len(live) > 0 {
		t.Errorf("live attempts left: %v", live)
	}
	if c := containers(t, ""); len(c) > 0 {
		t.Errorf("containers left: %v", c)
	}
}
