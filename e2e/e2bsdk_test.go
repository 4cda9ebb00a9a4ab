package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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
	d := startDaemonWith(t, "", "--e2b-addr", addr, "--e2b-keys", keys)
	// The SDK names the template by the group's name.
	createGroup(t, d, rootfs, "--name", "e2b-base")

	suite, err := filepath.Abs("e2bsdk")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, suite)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", "sdk.test.mjs")
	cmd.Dir = suite
	cmd.Env = append(os.Environ(),
		"E2B_API_KEY="+key,
		"E2B_API_URL=http://"+addr,
		"E2B_SANDBOX_URL=http://"+addr,
		"E2B_DEBUG=",
		"ESF_E2B_TEMPLATE=e2b-base",
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("node --test:\n%s", out.String())
	if err != nil {
		t.Fatalf("the E2B SDK suite failed: %v", err)
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
