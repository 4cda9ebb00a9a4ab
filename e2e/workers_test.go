package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/esf-dev/esf/internal/etcdtest"
)

var workerPrefixes atomic.Int64

// startWorker runs esfd as worker id of the graph on etcd under url, with a
// short lease TTL (the tests wait for conditions, never for the TTL).
func startWorker(t *testing.T, url, id string) *daemon {
	t.Helper()
	flags := []string{"--journal", url, "--worker", id}
	d := startDaemonWith(t, "", append(flags, "--worker-ttl", "2s")...)
	d.stopAllFlags = flags
	return d
}

func startEtcd(t *testing.T) (c *etcdtest.Cluster, url string) {
	t.Helper()
	requireFUSE(t)
	c = etcdtest.Start(t, etcdtest.Options{NoFsync: true})
	return c, c.URL(fmt.Sprintf("e2e-workers-%d", workerPrefixes.Add(1)))
}

type workersJSON struct {
	Workers []struct {
		ID   string `json:"id"`
		Live int    `json:"live"`
		Self bool   `json:"self"`
	} `json:"workers"`
	Fenced bool `json:"fenced"`
}

func workers(t *testing.T, d *daemon) workersJSON {
	t.Helper()
	var w workersJSON
	decode(t, d.mustCtl(nil, "-o", "json", "workers"), &w)
	return w
}

func (w workersJSON) ids() string {
	var ids []string
	for _, x := range w.Workers {
		ids = append(ids, x.ID)
	}
	return strings.Join(ids, ",")
}

// attemptState is an attempt's state as d reads it from the graph.
func attemptState(t *testing.T, d *daemon, id string) string {
	t.Helper()
	r := d.mustCtl(nil, "-o", "json", "inspect", id)
	var v struct {
		State   string `json:"state"`
		Attempt struct {
			State string `json:"state"`
		} `json:"attempt"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("inspect %s: %v\n%s", id, err, r.stdout)
	}
	if v.State != "" {
		return v.State
	}
	return v.Attempt.State
}

// eventually polls cond with a generous deadline (no timing is asserted).
func eventually(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// TestWorkers_StoppedWorkerIsFenced: two esfd workers on one etcd journal.
// Worker A is stopped (SIGSTOP) until its lease has ended, as B sees it,
// then continued: the first commit it tries right away is refused (the
// fencing compare, whatever A believes), its sandbox is gone, and every
// later commit is refused too; B has failed A's attempt and keeps its own.
func TestWorkers_StoppedWorkerIsFenced(t *testing.T) {
	_, url := startEtcd(t)
	a := startWorker(t, url, "wa")
	b := startWorker(t, url, "wb")
	ga := createGroup(t, a, smallTree(t, a, map[string]string{"a.txt": "a\n"}))
	gb := createGroup(t, b, smallTree(t, b, map[string]string{"b.txt": "b\n"}))
	atA := activate(t, a, ga.Node.NodeID)
	atB := activate(t, b, gb.Node.NodeID)
	eventually(t, "both workers listed", func() bool { return workers(t, b).ids() == "wa,wb" })

	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	continued := false
	cont := func() {
		if !continued {
			continued = true
			a.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(cont)
	took := eventually(t, "A's lease to end and B to fail A's attempt", func() bool {
		return workers(t, b).ids() == "wb" && attemptState(t, b, atA.AttemptID) == "failed"
	})
	t.Logf("A's lease ended and its attempt failed %v after SIGSTOP (TTL 2s)", took.Round(10*time.Millisecond))
	cont()

	src := smallTree(t, a, map[string]string{"late.txt": "late\n"})
	if r := a.ctl(nil, "group", "create", "--from", src); r.code == 0 || !strings.Contains(r.stderr, "lease") {
		t.Fatalf("a commit of the stopped worker right after SIGCONT: exit %d, %s%s; want refused, its lease lost", r.code, r.stdout, r.stderr)
	}
	eventually(t, "A to stop its sandbox", func() bool { return !mounted(atA.Root) })
	if w := workers(t, a); !w.Fenced {
		t.Fatalf("A after its lease ended: %+v, want fenced", w)
	}
	if r := a.ctl(nil, "group", "create", "--from", src); r.code == 0 {
		t.Fatalf("a later commit of the fenced worker succeeded: %s", r.stdout)
	}
	if r := a.ctl(nil, "activate", ga.Node.NodeID); r.code == 0 {
		t.Fatalf("the fenced worker activated an attempt: %s", r.stdout)
	}
	if s := attemptState(t, b, atB.AttemptID); s != "active" || !mounted(atB.Root) {
		t.Fatalf("B's own attempt: %s (mounted %v)", s, mounted(atB.Root))
	}
}

// TestWorkers_KilledWorkersAttemptsFail: worker A is SIGKILLed with live
// attempts; B fails them once A's lease ends, and A's stop-all (run by
// the teardown as worker wa) cleans what the kill left.
func TestWorkers_KilledWorkersAttemptsFail(t *testing.T) {
	_, url := startEtcd(t)
	a := startWorker(t, url, "wa")
	b := startWorker(t, url, "wb")
	ga := createGroup(t, a, smallTree(t, a, map[string]string{"a.txt": "a\n"}))
	kids := fork(t, a, ga.Node.NodeID, 2)
	at1, at2 := activate(t, a, kids[0]), activate(t, a, kids[1])
	eventually(t, "A's load published", func() bool {
		for _, w := range workers(t, b).Workers {
			if w.ID == "wa" && w.Live == 2 {
				return true
			}
		}
		return false
	})

	a.cmd.Process.Kill()
	<-a.exited
	took := eventually(t, "B to fail A's attempts", func() bool {
		return attemptState(t, b, at1.AttemptID) == "failed" && attemptState(t, b, at2.AttemptID) == "failed"
	})
	t.Logf("A's attempts failed %v after its SIGKILL (TTL 2s)", took.Round(10*time.Millisecond))
	if ids := workers(t, b).ids(); ids != "wb" {
		t.Fatalf("workers after A's death: %s", ids)
	}
}

// freePort is a loopback port nobody listens on (now).
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestWorkers_Forwarding: two workers on one etcd, each also listening on
// loopback with the same tokens. Through B's socket alone, a client pins an
// activation to A (forwarded), execs in it with and without stdin (the
// streams forwarded), and seals it (forwarded to the owner); an unpinned
// activation on B's node stays on B, the least loaded with capacity once A
// runs one.
func TestWorkers_Forwarding(t *testing.T) {
	requireRunc(t)
	_, url := startEtcd(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	listen := func(id string) *daemon {
		flags := []string{"--journal", url, "--worker", id}
		d := startDaemonWith(t, "", append(flags, "--worker-ttl", "5s", "--max-attempts", "4",
			"--listen", fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)), "--tokens", tokens)...)
		d.stopAllFlags = flags
		return d
	}
	a := listen("wa")
	b := listen("wb")
	ga := createGroup(t, a, busyboxTree(t, a))
	eventually(t, "both workers listed", func() bool { return workers(t, b).ids() == "wa,wb" })

	at := activate(t, b, ga.Node.NodeID, "--executor", "runc", "--worker", "wa")
	if !strings.HasPrefix(at.Root, filepath.Dir(a.state)) {
		t.Fatalf("the pinned attempt's root %s is not on worker A (%s)", at.Root, a.state)
	}
	r := b.ctl(nil, "exec", at.AttemptID, "--", "/bin/sh", "-c", "echo out; echo err >&2; echo x > /made; exit 3")
	if r.code != 3 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Fatalf("exec through B: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = b.ctl(strings.NewReader("hello\n"), "exec", "-i", at.AttemptID, "--", "cat")
	if r.code != 0 || r.stdout != "hello\n" {
		t.Fatalf("exec -i through B: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	s := suspend(t, b, at.AttemptID)
	if s.Attempt.State != "released" {
		t.Fatalf("suspend through B: %+v", s.Attempt)
	}

	// Unpinned: B's own node, with A busy, goes to B.
	gb := createGroup(t, b, smallTree(t, b, map[string]string{"b.txt": "b\n"}))
	busy := activate(t, a, ga.Node.NodeID)
	eventually(t, "A's load published", func() bool {
		for _, w := range workers(t, b).Workers {
			if w.ID == "wa" && w.Live == 1 {
				return true
			}
		}
		return false
	})
	onB := activate(t, b, gb.Node.NodeID)
	if !strings.HasPrefix(onB.Root, filepath.Dir(b.state)) {
		t.Fatalf("the unpinned attempt's root %s is not on the least loaded worker B (%s)", onB.Root, b.state)
	}
	b.mustCtl(nil, "release", busy.AttemptID) // forwarded to A
	b.mustCtl(nil, "release", onB.AttemptID)
}

// TestWorkers_RestartTakesRegistrationBack: a worker with a lease far
// longer than the test is SIGKILLed; esfd restarted on its state dir takes
// the id back at once (holding the state dir's lock, it knows the killed
// one is dead) instead of waiting out the lease, and serves as that worker.
func TestWorkers_RestartTakesRegistrationBack(t *testing.T) {
	_, url := startEtcd(t)
	flags := []string{"--journal", url, "--worker", "wa"}
	a := startDaemonWith(t, "", append(flags, "--worker-ttl", "1h")...)
	a.stopAllFlags = flags
	a.cmd.Process.Kill()
	<-a.exited
	// startDaemonWith waits for esfd to answer, which it does once
	// registered: with the old lease waited out, not within the test.
	b := startDaemonWith(t, a.state, append(flags, "--worker-ttl", "1h")...)
	b.stopAllFlags = flags
	if w := workers(t, b); w.ids() != "wa" || w.Fenced || !w.Workers[0].Self {
		t.Fatalf("workers after the restart: %+v", w)
	}
	if l := b.logs.String(); !strings.Contains(l, "taking it back") {
		t.Fatalf("the restarted esfd did not log taking its registration back:\n%s", l)
	}
}
