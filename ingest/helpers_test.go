package ingest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/internal/testenv"
)

// flatten reads the tree root from g and returns every entry by path; ""
// is the root. Directory entries carry their tree's attributes.
func flatten(t *testing.T, g cas.Getter, root cas.ID) map[string]cas.Entry {
	t.Helper()
	out := map[string]cas.Entry{}
	var walk func(prefix string, id cas.ID)
	walk = func(prefix string, id cas.ID) {
		tr, err := cas.ReadTree(context.Background(), g, id)
		if err != nil {
			t.Fatalf("read tree %s at %q: %v", id.Short(), prefix, err)
		}
		if prefix == "" {
			out[""] = cas.Entry{Type: cas.TypeDir, Attr: tr.Attr}
		}
		for _, e := range tr.Entries {
			p := e.Name
			if prefix != "" {
				p = prefix + "/" + e.Name
			}
			if e.Type == cas.TypeDir {
				sub, err := cas.ReadTree(context.Background(), g, e.ID)
				if err != nil {
					t.Fatal(err)
				}
				out[p] = cas.Entry{Name: e.Name, Type: cas.TypeDir, ID: e.ID, Attr: sub.Attr}
				walk(p, e.ID)
				continue
			}
			out[p] = e
		}
	}
	walk("", root)
	return out
}

func keys(m map[string]cas.Entry) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// blobOf reads a blob back.
func blobOf(t *testing.T, g cas.Getter, id cas.ID) []byte {
	t.Helper()
	b, err := cas.ReadAll(context.Background(), g, id)
	if err != nil {
		t.Fatalf("read blob %s: %v", id.Short(), err)
	}
	return b
}

func writeFile(t *testing.T, p string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	// WriteFile's mode passes through the umask, and os.Chmod takes Go's
	// mode bits, not setuid's 04000: chmod(2) it is.
	if err := unix.Chmod(p, uint32(mode)); err != nil {
		t.Fatal(err)
	}
}

// logBuffer collects what a logger wrote, for asserting warnings.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func testLogger() (*slog.Logger, *logBuffer) {
	lb := &logBuffer{}
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

// noLeaks fails the test if goroutines started during it are still running
// shortly after it ends.
func noLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Errorf("goroutines leaked: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:n])
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// tarEntry describes one member of a tar written by makeTar.
type tarEntry struct {
	hdr  tar.Header
	body string
}

func file(name, body string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body)),
		ModTime: time.Unix(1700000000, 0)}, body: body}
}

func dir(name string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(1700000000, 0)}}
}

func makeTar(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if h.Format == tar.FormatUnknown {
			h.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("write header %q: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// xattrsSupported reports whether the filesystem at dir takes user.* xattrs.
func xattrsSupported(t *testing.T, dir string) bool {
	t.Helper()
	p := filepath.Join(dir, ".xattr-probe")
	writeFile(t, p, nil, 0o644)
	defer os.Remove(p)
	err := unix.Lsetxattr(p, "user.probe", []byte("1"), 0)
	return !errors.Is(err, unix.ENOTSUP) && !errors.Is(err, unix.EPERM) && err == nil
}

func newStore() *mem.Store { return mem.New() }

// isRoot reports whether the test runs as root and can check ownership,
// device nodes and trusted.* xattrs too; under ESF_TEST_REQUIRE it fails
// instead of dropping those checks (internal/testenv).
func isRoot(t testing.TB) bool { return testenv.Has(t, "root") }

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.Require(t, "root") // device nodes, chown, trusted.* xattrs
}
