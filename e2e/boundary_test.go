package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBoundary_ConcurrentSuspendLoad: 32 clients, each running 3 cycles of
// fork -> activate (runc) -> exec (a write) -> suspend -> export check. Every
// suspend whose seal committed answers success (a busy root at the release
// is the daemon's to retry, not the caller's error), every node holds its
// own write and its ancestors', and no attempt's overlay outlives it.
func TestBoundary_ConcurrentSuspendLoad(t *testing.T) {
	requireRunc(t)
	d := startDaemon(t)
	g := createGroup(t, d, busyboxTree(t, d))
	const clients, cycles = 32, 3
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			node := g.Node.NodeID
			for cycle := range cycles {
				var err error
				if node, err = suspendCycle(d, node, c, cycle); err != nil {
					t.Errorf("client %d cycle %d: %v", c, cycle, err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d clients x %d cycles in %v", clients, cycles, time.Since(start).Round(time.Millisecond))
	// The releases that waited for a stopped container's root (and what
	// held it), for whoever reads a slow run.
	for _, l := range strings.Split(d.logs.String(), "\n") {
		if strings.Contains(l, "root of a stopped container") {
			t.Log(l)
		}
	}
	// Every suspend answered after its release: no attempt's mount is left.
	for _, m := range esfMounts(filepath.Dir(d.state)) {
		if strings.HasPrefix(m, filepath.Join(d.state, "attempts")+"/") {
			t.Errorf("mount left after every attempt was sealed: %s", m)
		}
	}
	out, err := findmntOverlays(d.state)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) > 0 {
		t.Errorf("overlays of %s left after every attempt was sealed: %v", d.state, out)
	}
}

// suspendCycle runs one fork -> activate -> exec -> suspend -> export check
// from node and returns the sealed node. Errors, not t.Fatal: it runs on a
// client's goroutine.
func suspendCycle(d *daemon, node string, client, cycle int) (string, error) {
	r := d.ctl(nil, "fork", node, "-n", "1")
	if r.code != 0 {
		return "", fmt.Errorf("fork: exit %d: %s", r.code, r.stderr)
	}
	kid := strings.TrimSpace(r.stdout)
	r = d.ctl(nil, "-o", "json", "activate", kid, "--executor", "runc")
	if r.code != 0 {
		return "", fmt.Errorf("activate: exit %d: %s", r.code, r.stderr)
	}
	var a attemptJSON
	if err := decodeErr(r.stdout, &a); err != nil {
		return "", fmt.Errorf("activate: %v", err)
	}
	want := fmt.Sprintf("client %d cycle %d", client, cycle)
	r = d.ctl(nil, "exec", a.AttemptID, "--", "/bin/sh", "-c", fmt.Sprintf("echo '%s' > /w%d", want, cycle))
	if r.code != 0 {
		return "", fmt.Errorf("exec: exit %d: %s", r.code, r.stderr)
	}
	r = d.ctl(nil, "-o", "json", "suspend", a.AttemptID)
	if r.code != 0 {
		return "", fmt.Errorf("suspend %s: exit %d: %s", a.AttemptID, r.code, r.stderr)
	}
	var s suspendJSON
	if err := decodeErr(r.stdout, &s); err != nil {
		return "", fmt.Errorf("suspend: %v", err)
	}
	if s.Node.Status != "sealed" || s.Attempt.State != "released" {
		return "", fmt.Errorf("suspend %s: node %s, attempt %s; want sealed and released", a.AttemptID, s.Node.Status, s.Attempt.State)
	}
	if mounted(a.Root) {
		return "", fmt.Errorf("attempt %s: root %s still mounted after its suspend answered", a.AttemptID, a.Root)
	}
	dest := filepath.Join(filepath.Dir(d.state), fmt.Sprintf("export-%d-%d", client, cycle))
	defer os.RemoveAll(dest)
	defer os.Remove(dest + ".provenance.json")
	r = d.ctl(nil, "export", s.Node.NodeID, "--to", dest)
	if r.code != 0 {
		return "", fmt.Errorf("export %s: exit %d: %s", s.Node.NodeID, r.code, r.stderr)
	}
	for c := 0; c <= cycle; c++ {
		b, err := os.ReadFile(filepath.Join(dest, fmt.Sprintf("w%d", c)))
		if w := fmt.Sprintf("client %d cycle %d\n", client, c); err != nil || string(b) != w {
			return "", fmt.Errorf("node %s: /w%d = %q, %v; want %q", s.Node.NodeID, c, b, err, w)
		}
	}
	return s.Node.NodeID, nil
}

// decodeErr parses esfctl -o json output into v.
func decodeErr(stdout string, v any) error {
	if err := json.Unmarshal([]byte(stdout), v); err != nil {
		return fmt.Errorf("stdout is not the JSON expected: %v\n%s", err, stdout)
	}
	return nil
}

// findmntOverlays lists the overlays in the host's mount namespace whose
// upper directory is under state (a custom root mounted elsewhere too).
func findmntOverlays(state string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, " - overlay ") && strings.Contains(l, "upperdir="+state+"/") {
			out = append(out, l)
		}
	}
	return out, nil
}
