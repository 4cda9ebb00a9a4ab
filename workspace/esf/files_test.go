package esf

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// sh runs a command in the session and fails the test unless it exits 0.
func sh(t *testing.T, s *Session, cmd string) string {
	t.Helper()
	res, err := s.Run(t.Context(), sandbox.Spec{}, cmd)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%s: %v, exit %d, stderr %q", cmd, err, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

func paths(infos []vfs.FileInfo) []string {
	var out []string
	for _, fi := range infos {
		out = append(out, fi.Path)
	}
	return out
}

func TestFiles(t *testing.T) {
	p := newProvider(t)
	s := create(t, p, workspace.Spec{WorkDir: "proj"}) // cwd /root/proj
	ctx := t.Context()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	// Writes land where the container looks, relative paths on cwd.
	must(s.Write(ctx, "src/a.txt", []byte("hello\nworld\n")))
	must(s.Write(ctx, "~/top.txt", []byte("Hello top\n")))
	must(s.Write(ctx, "/root/proj/src/deep/b.txt", []byte("hello deep\n")))
	must(s.Write(ctx, "src/bin.dat", []byte("hello\x00binary\n")))
	if got := sh(t, s, "cat /root/proj/src/a.txt /root/top.txt"); got != "hello\nworld\nHello top\n" {
		t.Errorf("container reads %q", got)
	}
	// And the container's writes are visible.
	sh(t, s, "echo from-container > /root/proj/c.txt; mkfifo /root/proj/fifo")
	if b, err := s.Read(ctx, "c.txt"); err != nil || string(b) != "from-container\n" {
		t.Errorf("read the container's file: %q, %v", b, err)
	}

	// Modes and owners: new 0644 root, replaced keep theirs.
	if got := sh(t, s, "stat -c '%a %u:%g' /root/proj/src/a.txt /root/proj/src /root/proj"); got != "644 0:0\n755 0:0\n755 0:0\n" {
		t.Errorf("new file and dirs: %q", got)
	}
	sh(t, s, "chown 1000:1001 /root/proj/src/a.txt; chmod 4750 /root/proj/src/a.txt")
	must(s.Write(ctx, "src/a.txt", []byte("hello again\n")))
	if got := sh(t, s, "stat -c '%a %u:%g' /root/proj/src/a.txt; cat /root/proj/src/a.txt"); got != "4750 1000:1001\nhello again\n" {
		t.Errorf("replaced file: %q", got)
	}

	errCases := []struct {
		name string
		do   func() error
		want error
	}{
		{"read a dir", func() error { _, err := s.Read(ctx, "src"); return err }, fs.ErrInvalid},
		{"read a fifo", func() error { _, err := s.Read(ctx, "fifo"); return err }, fs.ErrInvalid},
		{"read missing", func() error { _, err := s.Read(ctx, "nope"); return err }, fs.ErrNotExist},
		{"read empty path", func() error { _, err := s.Read(ctx, ""); return err }, fs.ErrInvalid},
		{"download a dir", func() error { _, err := s.Download(ctx, "/"); return err }, fs.ErrInvalid},
		{"download missing", func() error { _, err := s.Download(ctx, "/nope"); return err }, fs.ErrNotExist},
		{"write over a dir", func() error { return s.Write(ctx, "src", nil) }, fs.ErrInvalid},
		{"write under a file", func() error { return s.Write(ctx, "c.txt/x", nil) }, fs.ErrInvalid},
		{"list missing", func() error { _, err := s.List(ctx, "nope"); return err }, fs.ErrNotExist},
		{"delete missing", func() error { return s.Delete(ctx, "nope") }, fs.ErrNotExist},
		{"delete root", func() error { return s.Delete(ctx, "/") }, fs.ErrInvalid},
		{"delete root by ..", func() error { return s.Delete(ctx, "../../..") }, fs.ErrInvalid},
		{"bad glob", func() error { _, err := s.Glob(ctx, "["); return err }, fs.ErrInvalid},
		{"bad grep", func() error { _, err := s.Grep(ctx, "(", vfs.GrepOptions{}); return err }, fs.ErrInvalid},
	}
	for _, tc := range errCases {
		err := tc.do()
		var pe *fs.PathError
		if !errors.Is(err, tc.want) || !errors.As(err, &pe) {
			t.Errorf("%s: %v, want a *fs.PathError matching %v", tc.name, err, tc.want)
		}
	}

	infos, err := s.List(ctx, "src")
	must(err)
	want := []string{"/root/proj/src/a.txt", "/root/proj/src/bin.dat", "/root/proj/src/deep"}
	if !slices.Equal(paths(infos), want) {
		t.Errorf("list: %v, want %v", paths(infos), want)
	}
	if !infos[2].IsDir() || infos[0].Size != int64(len("hello again\n")) || infos[0].Mode.Perm() != 0o750 || infos[0].Mode&fs.ModeSetuid == 0 {
		t.Errorf("list infos: %+v", infos)
	}
	if infos, err := s.List(ctx, "src/a.txt"); err != nil || len(infos) != 1 || infos[0].Path != "/root/proj/src/a.txt" {
		t.Errorf("list of a file: %+v, %v", infos, err)
	}

	globs := []struct{ pattern, want string }{
		{"**/*.txt", "/root/proj/c.txt /root/proj/src/a.txt /root/proj/src/deep/b.txt"},
		{"/root/*.txt", "/root/top.txt"},
		{"src/*", "/root/proj/src/a.txt /root/proj/src/bin.dat /root/proj/src/deep"},
		{"/nowhere/**", ""},
	}
	for _, g := range globs {
		got, err := s.Glob(ctx, g.pattern)
		if err != nil || strings.Join(got, " ") != g.want {
			t.Errorf("glob %q: %v, %v; want %q", g.pattern, got, err, g.want)
		}
	}

	greps := []struct {
		pattern string
		opts    vfs.GrepOptions
		want    string
	}{
		{"hello", vfs.GrepOptions{}, "/root/proj/src/a.txt:1 /root/proj/src/deep/b.txt:1"},
		{"hello", vfs.GrepOptions{Path: "~", IgnoreCase: true}, "/root/proj/src/a.txt:1 /root/proj/src/deep/b.txt:1 /root/top.txt:1"},
		{"hello", vfs.GrepOptions{Path: "/root", Glob: "b.*"}, "/root/proj/src/deep/b.txt:1"},
		{"o", vfs.GrepOptions{Path: "/root", MaxMatches: 2}, "/root/proj/c.txt:1 /root/proj/src/a.txt:1"},
	}
	for _, g := range greps {
		ms, err := s.Grep(ctx, g.pattern, g.opts)
		var got []string
		for _, m := range ms {
			got = append(got, m.Path+":"+string(rune('0'+m.Line)))
		}
		if err != nil || strings.Join(got, " ") != g.want {
			t.Errorf("grep %q %+v: %v, %v; want %q", g.pattern, g.opts, got, err, g.want)
		}
	}

	must(s.Delete(ctx, "src/a.txt"))
	must(s.Delete(ctx, "src"))
	if _, err := s.List(ctx, "src"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("deleted tree still lists: %v", err)
	}
	if got := sh(t, s, "ls /root/proj"); got != "c.txt\nfifo\n" {
		t.Errorf("container sees after delete: %q", got)
	}
}

// TestSymlinksStayInRoot: a symlink in the session, whatever it points at,
// resolves inside the session's root, as it would in the container: no
// read, write, listing or delete reaches a host file through one.
func TestSymlinksStayInRoot(t *testing.T) {
	p := newProvider(t)
	s := create(t, p, workspace.Spec{})
	ctx := t.Context()
	hostDir := t.TempDir()
	secret := filepath.Join(hostDir, "secret")
	if err := os.WriteFile(secret, []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sh(t, s, strings.Join([]string{
		"ln -s " + secret + " /abs",
		"ln -s ../../../../../../../../../.." + secret + " /rel",
		"ln -s " + hostDir + " /hostdir",
		"mkdir -p /in /tree && echo inside > /in/target && ln -s /in/target /inlink",
		"ln -s " + hostDir + " /tree/link",
		"ln -s /proc/self/root/" + secret + " /magic",
	}, " && "))

	for _, p := range []string{"/abs", "/rel", "/hostdir/secret", "/magic", "/../../../../" + secret} {
		if b, err := s.Read(ctx, p); err == nil || bytes.Contains(b, []byte("secret")) {
			t.Errorf("read %s: %q, %v", p, b, err)
		}
		if rc, err := s.Download(ctx, p); err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			t.Errorf("download %s: %q", p, b)
		}
	}
	if b, err := s.Read(ctx, "/inlink"); err != nil || string(b) != "inside\n" {
		t.Errorf("a link inside the root: %q, %v", b, err)
	}
	// Under a link that names nothing inside the root, a write fails as
	// mkdir -p would; once the container has the directory, the write
	// lands there.
	if err := s.Write(ctx, "/hostdir/planted", []byte("x")); err == nil {
		t.Errorf("write under a dangling dir link succeeded")
	}
	sh(t, s, "mkdir -p "+hostDir)
	if err := s.Write(ctx, "/hostdir/planted", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(hostDir, "planted")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("write through a dir link reached the host: %v", err)
	}
	if got := sh(t, s, "cat "+hostDir+"/planted"); got != "x" {
		t.Errorf("planted file inside the root: %q", got)
	}
	if infos, err := s.List(ctx, "/hostdir"); err != nil || len(infos) != 1 || infos[0].Path != "/hostdir/planted" {
		t.Errorf("list through the link: %v, %v", paths(infos), err)
	}
	// Replacing a link replaces the link, never its target.
	if err := s.Upload(ctx, "/abs", strings.NewReader("replaced")); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, s, "test -L /abs || echo file; cat /abs"); got != "file\nreplaced" {
		t.Errorf("uploaded over a link: %q", got)
	}
	// Deletes remove links, never what they name.
	if err := s.Delete(ctx, "/tree"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "/rel"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "host secret\n" {
		t.Errorf("host file after all that: %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(hostDir); len(ents) != 1 {
		t.Errorf("host dir holds %d entries", len(ents))
	}
	// Listings show links as links.
	infos, err := s.List(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	for _, fi := range infos {
		if fi.Path == "/hostdir" && (fi.Mode&fs.ModeSymlink == 0 || fi.Target != hostDir) {
			t.Errorf("listed link: %+v", fi)
		}
	}
}

// patternReader yields n deterministic pseudo-random bytes.
type patternReader struct {
	rng *rand.ChaCha8
	n   int64
}

func (r *patternReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.n {
		p = p[:r.n]
	}
	n, _ := r.rng.Read(p)
	r.n -= int64(n)
	return n, nil
}

// heapWatch samples the heap in use until stopped and returns its peak.
func heapWatch() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak.Load()
	}
}

// TestLargeFileStreams moves 256 MiB (64 MiB with -short) up and down and
// checks the bytes, the size the container sees, and that neither
// direction holds the file in memory (the conformance suite moves 1 GiB).
func TestLargeFileStreams(t *testing.T) {
	p := newProvider(t)
	s := create(t, p, workspace.Spec{})
	ctx := t.Context()
	size := int64(256 << 20)
	if testing.Short() {
		size = 64 << 20
	}
	h := sha256.New()
	src := io.TeeReader(&patternReader{rng: rand.NewChaCha8([32]byte{1}), n: size}, h)
	runtime.GC()
	stop := heapWatch()
	start := time.Now()
	if err := s.Upload(ctx, "/var/big.bin", src); err != nil {
		t.Fatal(err)
	}
	up := time.Since(start)
	want := h.Sum(nil)

	start = time.Now()
	rc, err := s.Download(ctx, "/var/big.bin")
	if err != nil {
		t.Fatal(err)
	}
	h.Reset()
	n, err := io.Copy(h, rc)
	rc.Close()
	down := time.Since(start)
	peak := stop()
	if err != nil || n != size || !bytes.Equal(h.Sum(nil), want) {
		t.Fatalf("download: %d bytes, %v, digest match %v", n, err, bytes.Equal(h.Sum(nil), want))
	}
	if got := sh(t, s, "stat -c %s /var/big.bin"); got != strconv.FormatInt(size, 10)+"\n" {
		t.Errorf("container sees size %q", got)
	}
	if peak > 48<<20 {
		t.Errorf("heap peaked at %d MiB moving %d MiB: not streamed", peak>>20, size>>20)
	}
	mib := float64(size) / (1 << 20)
	t.Logf("%d MiB: upload %v (%.0f MiB/s), download %v (%.0f MiB/s), heap peak %d MiB",
		size>>20, up.Round(time.Millisecond), mib/up.Seconds(), down.Round(time.Millisecond), mib/down.Seconds(), peak>>20)
}

// cancelAfter is a reader that cancels its context once it has yielded n
// bytes, and goes on yielding: the upload must notice and stop.
type cancelAfter struct {
	n      int64
	cancel context.CancelFunc
}

func (r *cancelAfter) Read(p []byte) (int, error) {
	if r.n <= 0 {
		r.cancel()
	}
	r.n -= int64(len(p))
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// TestUploadCancelKeepsOldFile: an upload cut by its context leaves the
// old file and no temporary file; the session then closes clean.
func TestUploadCancelKeepsOldFile(t *testing.T) {
	p := newProvider(t)
	s := create(t, p, workspace.Spec{})
	ctx := t.Context()
	if err := s.Write(ctx, "/up/f", []byte("old")); err != nil {
		t.Fatal(err)
	}
	att := attemptOf(s)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	err := s.Upload(cctx, "/up/f", &cancelAfter{n: 16 << 20, cancel: cancel})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled upload: %v", err)
	}
	if b, err := s.Read(ctx, "/up/f"); err != nil || string(b) != "old" {
		t.Errorf("after a cancelled upload: %q, %v", b, err)
	}
	if infos, err := s.List(ctx, "/up"); err != nil || len(infos) != 1 {
		t.Errorf("upload dir holds %v, %v", paths(infos), err)
	}
	// A download cut by its context.
	if err := s.Upload(ctx, "/up/big", &patternReader{rng: rand.NewChaCha8([32]byte{2}), n: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithCancel(ctx)
	rc, err := s.Download(dctx, "/up/big")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(rc, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	dcancel()
	if _, err := io.ReadAll(rc); !errors.Is(err, context.Canceled) {
		t.Errorf("read after the download's context ended: %v", err)
	}
	rc.Close()
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if c := containers(t, att); len(c) > 0 {
		t.Errorf("containers after close: %v", c)
	}
	noLeaks(t)
}
