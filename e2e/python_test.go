package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/esf-dev/esf/internal/testcert"
	"github.com/esf-dev/esf/internal/testenv"
)

// pythonMaxAttempts is the live-attempt quota of the daemon the Python
// suite runs against: the quota test and the RL fan-out example need one.
const pythonMaxAttempts = 3

// TestPython_Client runs the Python client's unittest suite
// (clients/python/tests) against a real esfd with runc: every operation,
// the error classes, a replayed mutation applied once, exec streaming with
// stdin, events follow, https with a bearer token, README.md's quick
// start, both examples, and (tests/test_packaging.py) that pip installs
// the package offline and the code is Python 3.9's. The
// daemon has a live-attempt quota and a TLS network listener with a token,
// which the suite finds through ESF_TEST_* variables.
func TestPython_Client(t *testing.T) {
	testenv.Require(t, "root", "fuse", "overlay", "runc", "busybox", "cmd:python3")
	requireFUSE(t)
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca, err := testcert.NewCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue("esfd", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens")
	token := filepath.Join(dir, "token")
	for _, f := range []string{tokens, token} {
		if err := os.WriteFile(f, []byte("python-client-token-0123456789\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	d := startDaemonWith(t, "", "--max-attempts", strconv.Itoa(pythonMaxAttempts),
		"--listen", "tcp://"+addr, "--tls-cert", pair.CertFile, "--tls-key", pair.KeyFile, "--tokens", tokens)

	// The suite takes well under a minute on an idle machine; the bound
	// is for a loaded one.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "unittest", "discover", "-v", "-s", "tests")
	cmd.Dir = filepath.Join("..", "clients", "python")
	tmp := filepath.Join(dir, "tmp") // the suite's source trees and exports
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(),
		"ESF_SOCKET="+d.socket,
		"ESF_HOST=", // the suite's clients must not pick up a caller's daemon
		"ESF_TEST_MAX_ATTEMPTS="+strconv.Itoa(pythonMaxAttempts),
		"ESF_TEST_HOST=https://"+addr,
		"ESF_TEST_TOKEN_FILE="+token,
		"ESF_TEST_CACERT="+ca.CertFile,
		"ESF_TEST_REQUIRE=all", // a skip here is a failure: the daemon has everything
		"PYTHONDONTWRITEBYTECODE=1",
		"PYTHONUNBUFFERED=1",
		"TMPDIR="+tmp,
	)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest (%v):\n%s", time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("the Python client's suite failed: %v", err)
	}
}
