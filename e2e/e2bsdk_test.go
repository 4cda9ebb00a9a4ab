package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/internal/testenv"
)

// TestE2BSDK runs e2e/e2bsdk: the unmodified E2B JavaScript SDK (npm e2b,
// pinned with a lock file) against esfd --e2b-addr, with runc, over a
// minimal rootfs of busybox and Debian's static bash (nothing of esf
// inside). The suite covers every call the front door serves; see
// e2e/e2bsdk/sdk.test.mjs.
func TestE2BSDK(t *testing.T) {
	e := startE2B(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", "sdk.test.mjs")
	cmd.Dir = e.suite
	cmd.Env = e.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("node --test:\n%s", out.String())
	if err != nil {
		t.Fatalf("the E2B SDK suite failed: %v", err)
	}
	// esfctl tree shows what the session did: its pauses (pause and
	// autoPause), the fork's checkpoint and 3 children, and the snapshot
	// (pruned by its deletion, still in the tree) are nodes of the
	// template's group, beside its root: 8 at least.
	var tree struct {
		Nodes []json.RawMessage `json:"nodes"`
	}
	decode(t, e.d.mustCtl(nil, "-o", "json", "tree", e.groupID), &tree)
	if n := len(tree.Nodes); n < 8 {
		t.Fatalf("esfctl tree %s: %d nodes, want the session's pauses, forks and snapshots", e.groupID, n)
	}
}

// e2bEnv is an esfd serving the E2B front door, with a template group
// named e2b-base, and what the SDK suite needs to reach it.
type e2bEnv struct {
	d       *daemon
	flags   []string // esfd's --e2b-* flags (to start it again)
	groupID string   // the template's group
	suite   string   // e2e/e2bsdk, its dependencies installed
	env     []string // the SDK's environment
}

// startE2B starts esfd --e2b-addr over a minimal rootfs of busybox and
// Debian's static bash (nothing of esf inside) and installs the SDK.
func startE2B(t *testing.T) *e2bEnv {
	t.Helper()
	testenv.Require(t, "root", "fuse", "overlay", "runc", "busybox", "cmd:node", "cmd:npm", "cmd:bash-static")
	requireFUSE(t)
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	if err := runctest.Busybox(rootfs); err != nil {
		t.Fatal(err)
	}
	bash, err := exec.LookPath("bash-static")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bash)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(rootfs, "bin", "bash"))
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "bash"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	const key = "e2b_0123456789abcdef0123456789abcdef01234567"
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	e := &e2bEnv{flags: []string{"--e2b-addr", addr, "--e2b-keys", keys, "--e2b-domain", "e2b.esf.test"}}
	e.d = startDaemonWith(t, "", e.flags...)
	// The SDK names the template by the group's name.
	e.groupID = createGroup(t, e.d, rootfs, "--name", "e2b-base").Group.GroupID

	if e.suite, err = filepath.Abs("e2bsdk"); err != nil {
		t.Fatal(err)
	}
	npmCI(t, e.suite)
	e.env = append(os.Environ(),
		"E2B_API_KEY="+key,
		"E2B_API_URL=http://"+addr,
		"E2B_SANDBOX_URL=http://"+addr,
		"E2B_DEBUG=",
		"ESF_E2B_TEMPLATE=e2b-base",
		"ESF_E2B_DOMAIN=e2b.esf.test",
	)
	return e
}

// node runs a script of the suite with args and returns its stdout.
func (e *e2bEnv) node(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Dir = e.suite
	cmd.Env = e.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %v: %v\n%s%s", args, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// TestE2BRestart: E2B sandboxes survive an esfd restart, by SIGTERM and
// by SIGKILL (docs/e2b.md, State). Driven by the unmodified SDK
// (e2bsdk/restart.mjs): before the restart, a sandbox is made, written
// and paused, another made, written and snapshotted, a third killed;
// after it, the running one is listed and reachable with the access
// token its handle held and through connect, the paused one resumes with
// its files and envs, the snapshot is listed and a template, the killed
// one stays gone.
func TestE2BRestart(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			e := startE2B(t)
			state := strings.TrimSpace(e.node(t, "restart.mjs", "before"))
			if err := e.d.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case <-e.d.exited:
			case <-time.After(30 * time.Second):
				t.Fatalf("esfd did not exit on %v", sig)
			}
			again := startDaemonWith(t, e.d.state, e.flags...)
			if out := e.node(t, "restart.mjs", "after", state); !strings.HasSuffix(out, "ok\n") {
				t.Fatalf("after the restart: %q", out)
			}
			if !strings.Contains(again.logs.String(), "e2b: state restored") {
				t.Fatalf("the restarted esfd did not restore its E2B state:\n%s", again.logs.String())
			}
		})
	}
}

// npmCI installs the suite's locked dependencies with npm ci, unless
// node_modules already holds what this package-lock.json pins (a stamp of
// its digest): a warm machine does not fetch or reinstall anything.
func npmCI(t *testing.T, dir string) {
	t.Helper()
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	want := hex.EncodeToString(sum[:])
	stamp := filepath.Join(dir, "node_modules", ".esf-lock-sha256")
	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}
	if err := os.WriteFile(stamp, []byte(want), 0o644); err != nil {
		t.Fatal(err)
	}
}
