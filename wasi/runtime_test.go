package wasi_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/wasi"
	"github.com/esf-dev/esf/wasi/wasitest"
)

var (
	sharedOnce     sync.Once
	shared         *wasi.Runtime
	sharedErr      error
	sharedCacheDir string
	// guestCompile is how long the shared runtime took to compile the
	// guest with an empty cache dir.
	guestCompile struct {
		sync.Mutex
		d time.Duration
	}
)

// TestMain closes the runtime the tests share, so the compiled guest is
// paid for once per test binary, and removes its cache dir.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "wasi-test-cache-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sharedCacheDir = dir
	code := m.Run()
	if shared != nil {
		if err := shared.Close(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "close shared runtime:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func sharedRuntime(t testing.TB) *wasi.Runtime {
	t.Helper()
	sharedOnce.Do(func() {
		shared, sharedErr = wasi.New(context.Background(), wasi.Options{CacheDir: sharedCacheDir})
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

func newRuntime(t testing.TB, opts wasi.Options) *wasi.Runtime {
	t.Helper()
	r, err := wasi.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return r
}

type outcome struct {
	res            wasi.Result
	err            error
	stdout, stderr string
}

// runGuest runs the test guest with args in root (a fresh dir if "").
func runGuest(t *testing.T, ctx context.Context, spec wasi.Spec, args ...string) outcome {
	t.Helper()
	spec.Module = wasitest.Guest(t)
	spec.Args = append([]string{"guest"}, args...)
	o := run(t, sharedRuntime(t), ctx, spec)
	if o.res.Compiled {
		guestCompile.Lock()
		guestCompile.d = o.res.Compile
		guestCompile.Unlock()
	}
	return o
}

func run(t *testing.T, r *wasi.Runtime, ctx context.Context, spec wasi.Spec) outcome {
	t.Helper()
	if spec.Root == "" {
		spec.Root = t.TempDir()
	}
	var stdout, stderr bytes.Buffer
	if spec.Stdout == nil {
		spec.Stdout = &stdout
	}
	if spec.Stderr == nil {
		spec.Stderr = &stderr
	}
	res, err := r.Run(ctx, spec)
	return outcome{res: res, err: err, stdout: stdout.String(), stderr: stderr.String()}
}

// noLeak fails t if goroutines started during the test are still running
// shortly after it; wazero's context watcher and ours must be gone.
func noLeak(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(time.Minute)
		for {
			n := runtime.NumGoroutine()
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("goroutines: %d before, %d after\n%s", before, n, buf)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func TestRun_ExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		module []byte
		args   []string
		want   int
	}{
		{"go exit 0", nil, []string{"exit", "0"}, 0},
		{"go exit 3", nil, []string{"exit", "3"}, 3},
		{"go exit 255", nil, []string{"exit", "255"}, 255},
		{"go main returns", nil, []string{"args"}, 0},
		{"proc_exit 7", wasitest.ExitModule(7), nil, 7},
		{"proc_exit 0", wasitest.ExitModule(0), nil, 0},
		{"start returns", wasitest.Module{MemMin: 1, ExportMemory: true}.Bytes(), nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o outcome
			if tc.module == nil {
				o = runGuest(t, context.Background(), wasi.Spec{}, tc.args...)
			} else {
				o = run(t, sharedRuntime(t), context.Background(), wasi.Spec{Module: tc.module})
			}
			if o.err != nil {
				t.Fatalf("Run: %v (stderr %q)", o.err, o.stderr)
			}
			if o.res.ExitCode != tc.want {
				t.Errorf("exit code %d, want %d (stderr %q)", o.res.ExitCode, tc.want, o.stderr)
			}
		})
	}
}

func TestRun_Args(t *testing.T) {
	args := []string{"args", "a", "b c", "", "ü\ttab", "--flag=x"}
	o := runGuest(t, context.Background(), wasi.Spec{}, args...)
	if o.err != nil || o.res.ExitCode != 0 {
		t.Fatalf("Run: %v, exit %d, stderr %q", o.err, o.res.ExitCode, o.stderr)
	}
	want := strings.Join(append([]string{"guest"}, args...), "\n") + "\n"
	if o.stdout != want {
		t.Errorf("argv printed as %q, want %q", o.stdout, want)
	}
}

func TestRun_Env(t *testing.T) {
	t.Setenv("ESF_HOST_ONLY", "leak")
	o := runGuest(t, context.Background(), wasi.Spec{Env: []string{"A=1", "EMPTY=", "EQ=x=y"}}, "env")
	if o.err != nil || o.res.ExitCode != 0 {
		t.Fatalf("Run: %v, exit %d, stderr %q", o.err, o.res.ExitCode, o.stderr)
	}
	if want := "A=1\nEMPTY=\nEQ=x=y\n"; o.stdout != want {
		t.Errorf("environment %q, want exactly %q (nothing of the host's)", o.stdout, want)
	}
}

func TestRun_StdinToStdout(t *testing.T) {
	in := make([]byte, 3<<20+17)
	rand.Read(in)
	o := runGuest(t, context.Background(), wasi.Spec{Stdin: bytes.NewReader(in)}, "echo")
	if o.err != nil || o.res.ExitCode != 0 {
		t.Fatalf("Run: %v, exit %d, stderr %q", o.err, o.res.ExitCode, o.stderr)
	}
	if !bytes.Equal([]byte(o.stdout), in) {
		t.Errorf("stdout is %d bytes, differs from the %d bytes of stdin", len(o.stdout), len(in))
	}
}

func TestRun_NoStdinIsEmpty(t *testing.T) {
	o := runGuest(t, context.Background(), wasi.Spec{}, "echo")
	if o.err != nil || o.res.ExitCode != 0 || o.stdout != "" {
		t.Fatalf("Run: %v, exit %d, stdout %q", o.err, o.res.ExitCode, o.stdout)
	}
}

func TestRun_StderrSeparate(t *testing.T) {
	o := runGuest(t, context.Background(), wasi.Spec{}, "stderr", "to stderr")
	if o.err != nil || o.res.ExitCode != 0 {
		t.Fatalf("Run: %v, exit %d", o.err, o.res.ExitCode)
	}
	if o.stdout != "to stdout\n" || o.stderr != "to stderr\n" {
		t.Errorf("stdout %q, stderr %q", o.stdout, o.stderr)
	}
}

// TestRun_OutputIsStreamed proves output reaches the caller while the
// module still runs: the guest echoes a line, and only after the test has
// read it back is stdin closed and the module allowed to finish.
func TestRun_OutputIsStreamed(t *testing.T) {
	noLeak(t)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan outcome, 1)
	go func() {
		done <- runGuest(t, context.Background(), wasi.Spec{Stdin: inR, Stdout: outW}, "echo")
		outW.Close()
	}()
	if _, err := io.WriteString(inW, "ping\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("read %q, %v", line, err)
	}
	select {
	case o := <-done:
		t.Fatalf("module finished before stdin was closed: %+v", o)
	default:
	}
	inW.Close()
	go io.Copy(io.Discard, outR)
	if o := <-done; o.err != nil || o.res.ExitCode != 0 {
		t.Fatalf("Run: %v, exit %d, stderr %q", o.err, o.res.ExitCode, o.stderr)
	}
}

func TestRun_Timeout(t *testing.T) {
	for _, tc := range []struct {
		name   string
		module []byte
		args   []string
		stdin  func(t *testing.T) io.Reader
	}{
		{name: "go busy loop", args: []string{"guest", "spin"}},
		{name: "go sleep", args: []string{"guest", "sleep", "1h"}},
		{name: "wasm loop", module: wasitest.LoopModule()},
		{name: "blocked on stdin pipe", args: []string{"guest", "echo"}, stdin: func(t *testing.T) io.Reader {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close(); w.Close() })
			return r
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noLeak(t)
			spec := wasi.Spec{Module: tc.module, Args: tc.args}
			if spec.Module == nil {
				spec.Module = wasitest.Guest(t)
			}
			if tc.stdin != nil {
				spec.Stdin = tc.stdin(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			o := run(t, sharedRuntime(t), ctx, spec)
			took := time.Since(start)
			if !errors.Is(o.err, context.DeadlineExceeded) {
				t.Fatalf("Run: %v (exit %d), want context.DeadlineExceeded", o.err, o.res.ExitCode)
			}
			if c := errdefs.CodeOf(o.err); c != errdefs.CodeDeadlineExceeded {
				t.Errorf("code %q, want %q", c, errdefs.CodeDeadlineExceeded)
			}
			// The compile of a cold guest is not interruptible; allow it.
			// The bound is far from the guests' endless run and from
			// what a loaded machine adds to the deadline.
			if took-o.res.Compile > 30*time.Second {
				t.Errorf("stopped %v after start, want soon after the 300ms deadline", took)
			}
		})
	}
}

func TestRun_Cancel(t *testing.T) {
	noLeak(t)
	wasitest.Guest(t) // build outside the measured window
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	o := runGuest(t, ctx, wasi.Spec{}, "spin")
	if !errors.Is(o.err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled", o.err)
	}
	// Cancelled before it starts: nothing runs.
	o = runGuest(t, ctx, wasi.Spec{}, "exit", "0")
	if !errors.Is(o.err, context.Canceled) {
		t.Fatalf("Run with a cancelled context: %v", o.err)
	}
}

// TestRun_ExitCodeThatLooksLikeTimeout: a guest may pass wazero's
// deadline sentinel to proc_exit; without a context that ended it is just
// an exit code.
func TestRun_ExitCodeThatLooksLikeTimeout(t *testing.T) {
	o := run(t, sharedRuntime(t), context.Background(), wasi.Spec{Module: wasitest.ExitModule(-268435457)}) // 0xefffffff
	if o.err != nil || o.res.ExitCode != 0xefffffff {
		t.Fatalf("Run: %v, exit %#x", o.err, o.res.ExitCode)
	}
}

func TestRun_MemoryLimit(t *testing.T) {
	noLeak(t)
	t.Run("go guest over its limit", func(t *testing.T) {
		o := runGuest(t, context.Background(), wasi.Spec{MemoryLimitPages: 256}, "alloc", "40") // 16 MiB limit
		if !errors.Is(o.err, wasi.ErrQuotaExceeded) {
			t.Fatalf("Run: %v (exit %d, stderr %q), want ErrQuotaExceeded", o.err, o.res.ExitCode, o.stderr)
		}
		if c := errdefs.CodeOf(o.err); c != errdefs.CodeQuotaExceeded {
			t.Errorf("code %q", c)
		}
		t.Logf("error: %v", o.err)
		if !strings.Contains(o.err.Error(), "memory limit of 256 pages") {
			t.Errorf("message %q does not name the limit", o.err)
		}
		if o.res.MemoryPages > 256 || o.res.ExitCode == 0 {
			t.Errorf("result %+v: memory above the limit or a clean exit", o.res)
		}
	})
	t.Run("go guest under its limit", func(t *testing.T) {
		o := runGuest(t, context.Background(), wasi.Spec{MemoryLimitPages: 1024}, "alloc", "24") // 64 MiB limit
		if o.err != nil || o.res.ExitCode != 0 || o.stdout != "24\n" {
			t.Fatalf("Run: %v, exit %d, stdout %q, stderr %q", o.err, o.res.ExitCode, o.stdout, o.stderr)
		}
		if o.res.MemoryPages < 384 || o.res.MemoryPages > 1024 {
			t.Errorf("peak memory %d pages, want between 24 MiB and the limit", o.res.MemoryPages)
		}
	})
	for _, tc := range []struct {
		name string
		mod  wasitest.Module
	}{
		{"declared minimum", wasitest.Module{MemMin: 100, ExportMemory: true}},
		{"hidden minimum", wasitest.Module{MemMin: 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := run(t, sharedRuntime(t), context.Background(), wasi.Spec{Module: tc.mod.Bytes(), MemoryLimitPages: 10})
			if !errors.Is(o.err, wasi.ErrQuotaExceeded) {
				t.Fatalf("Run: %v, want ErrQuotaExceeded", o.err)
			}
		})
	}
}

func TestRun_Trap(t *testing.T) {
	o := run(t, sharedRuntime(t), context.Background(), wasi.Spec{Module: wasitest.TrapModule()})
	if o.err != nil {
		t.Fatalf("Run: %v; a trap is the module's failure, not Run's", o.err)
	}
	if o.res.ExitCode != wasi.TrapExitCode || !strings.Contains(o.res.Trap, "unreachable") {
		t.Errorf("result %+v", o.res)
	}
	if !strings.Contains(o.stderr, "trapped") {
		t.Errorf("stderr %q does not report the trap", o.stderr)
	}
}

func TestRun_BadModules(t *testing.T) {
	for _, tc := range []struct {
		name   string
		module []byte
	}{
		{"not wasm", []byte("#!/bin/sh\necho hi\n")},
		{"truncated", wasitest.ExitModule(1)[:20]},
		{"unknown import", wasitest.Module{MemMin: 1, ExportMemory: true, ExtraImport: "launch_missiles"}.Bytes()},
		{"no _start", wasitest.Module{MemMin: 1, ExportMemory: true, NoStart: true}.Bytes()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := run(t, sharedRuntime(t), context.Background(), wasi.Spec{Module: tc.module})
			if !errors.Is(o.err, wasi.ErrInvalidArgument) {
				t.Fatalf("Run: %v, want ErrInvalidArgument", o.err)
			}
		})
	}
}

func TestRun_InvalidSpec(t *testing.T) {
	dir := t.TempDir()
	mod := wasitest.ExitModule(0)
	for _, tc := range []struct {
		name string
		spec wasi.Spec
		want error
	}{
		{"no module", wasi.Spec{Root: dir}, wasi.ErrInvalidArgument},
		{"relative root", wasi.Spec{Module: mod, Root: "rel"}, wasi.ErrInvalidArgument},
		{"missing root", wasi.Spec{Module: mod, Root: filepath.Join(dir, "nope")}, wasi.ErrNotFound},
		{"root is a file", wasi.Spec{Module: mod, Root: writeFile(t, dir, "f", "x")}, wasi.ErrInvalidArgument},
		{"NUL in argument", wasi.Spec{Module: mod, Root: dir, Args: []string{"a\x00b"}}, wasi.ErrInvalidArgument},
		{"env without =", wasi.Spec{Module: mod, Root: dir, Env: []string{"A"}}, wasi.ErrInvalidArgument},
		{"env with empty key", wasi.Spec{Module: mod, Root: dir, Env: []string{"=x"}}, wasi.ErrInvalidArgument},
		{"mount at /", wasi.Spec{Module: mod, Root: dir, ExtraReadOnly: map[string]string{"/": dir}}, wasi.ErrInvalidArgument},
		{"mount not clean", wasi.Spec{Module: mod, Root: dir, ExtraReadOnly: map[string]string{"/a/../b": dir}}, wasi.ErrInvalidArgument},
		{"mount source missing", wasi.Spec{Module: mod, Root: dir, ExtraReadOnly: map[string]string{"/data": filepath.Join(dir, "nope")}}, wasi.ErrNotFound},
		{"memory limit too large", wasi.Spec{Module: mod, Root: dir, MemoryLimitPages: wasi.MaxMemoryLimitPages + 1}, wasi.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sharedRuntime(t).Run(context.Background(), tc.spec)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Run: %v, want %v", err, tc.want)
			}
		})
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRun_WritesLandInRoot(t *testing.T) {
	root := t.TempDir()
	writeFile(t, root, "old.txt", "old")
	steps := [][]string{
		{"mkdir", "/out/deep"},
		{"write", "/out/deep/new.txt", "hello from wasm"},
		{"write", "/old.txt", "overwritten"},
		{"symlink", "deep/new.txt", "/out/link"},
		{"rm", "/out/link"},
		{"symlink", "/out/deep/new.txt", "/out/abs"},
	}
	for _, args := range steps {
		if o := runGuest(t, context.Background(), wasi.Spec{Root: root}, args...); o.err != nil || o.res.ExitCode != 0 {
			t.Fatalf("%v: %v, exit %d, stderr %q", args, o.err, o.res.ExitCode, o.stderr)
		}
	}
	for name, want := range map[string]string{"out/deep/new.txt": "hello from wasm", "old.txt": "overwritten"} {
		if b, err := os.ReadFile(filepath.Join(root, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", name, b, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "out/link")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed link: %v", err)
	}
	if target, err := os.Readlink(filepath.Join(root, "out/abs")); err != nil || target != "/out/deep/new.txt" {
		t.Errorf("symlink target %q, %v; stored verbatim", target, err)
	}
	// The absolute link resolves inside the root, for the guest too.
	o := runGuest(t, context.Background(), wasi.Spec{Root: root}, "read", "/out/abs")
	if o.err != nil || o.stdout != "hello from wasm" {
		t.Errorf("read through absolute link: %v, %q, stderr %q", o.err, o.stdout, o.stderr)
	}
	st, err := os.Stat(filepath.Join(root, "out/deep/new.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		t.Errorf("created file mode %v; WASI creates 0600", st.Mode())
	}
}

// TestRootFS_SymlinksStayInside is the reason rootfs exists: with
// wazero's DirFS every one of these reads the secret outside the root.
func TestRootFS_SymlinksStayInside(t *testing.T) {
	outside := t.TempDir()
	writeFile(t, outside, "secret", "SECRET")
	root := t.TempDir()
	writeFile(t, root, "inside/secret", "inside")
	relOut, err := filepath.Rel(root, outside)
	if err != nil {
		t.Fatal(err)
	}
	up := strings.Repeat("../", 20)
	for name, target := range map[string]string{
		"rel":    relOut, // ../<outside>
		"deep":   up + strings.TrimPrefix(outside, "/"),
		"abs":    outside, // absolute: the host's path, inside the root
		"absdir": "/inside",
	} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string // stdout; "" means the read must fail
	}{
		{[]string{"read", "/rel/secret"}, ""},
		{[]string{"read", "/deep/secret"}, ""},
		{[]string{"read", "/abs/secret"}, ""},
		{[]string{"read", "/absdir/secret"}, "inside"},
		{[]string{"read", "/../../../../" + outside + "/secret"}, ""},
		{[]string{"ls", "/deep"}, ""},
	} {
		o := runGuest(t, context.Background(), wasi.Spec{Root: root}, tc.args...)
		if o.err != nil {
			t.Fatalf("%v: %v", tc.args, o.err)
		}
		if strings.Contains(o.stdout, "SECRET") {
			t.Errorf("%v escaped the root: %q", tc.args, o.stdout)
		}
		if tc.want != "" && o.stdout != tc.want {
			t.Errorf("%v: %q (exit %d, %q), want %q", tc.args, o.stdout, o.res.ExitCode, o.stderr, tc.want)
		}
		if tc.want == "" && o.res.ExitCode == 0 {
			t.Errorf("%v succeeded: %q", tc.args, o.stdout)
		}
	}
	// A link the guest makes is no way out either.
	for _, args := range [][]string{
		{"symlink", up + strings.TrimPrefix(outside, "/"), "/mine"},
		{"symlink", outside, "/mineabs"},
	} {
		if o := runGuest(t, context.Background(), wasi.Spec{Root: root}, args...); o.err != nil || o.res.ExitCode != 0 {
			t.Fatalf("%v: %v, %q", args, o.err, o.stderr)
		}
	}
	for _, p := range []string{"/mine/secret", "/mineabs/secret"} {
		o := runGuest(t, context.Background(), wasi.Spec{Root: root}, "read", p)
		if strings.Contains(o.stdout, "SECRET") || o.res.ExitCode == 0 {
			t.Errorf("read %s through a guest-made link: exit %d, %q", p, o.res.ExitCode, o.stdout)
		}
		o = runGuest(t, context.Background(), wasi.Spec{Root: root}, "write", p, "pwned")
		if o.res.ExitCode == 0 {
			t.Errorf("write %s through a guest-made link succeeded", p)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "SECRET" {
		t.Errorf("outside file changed: %q", b)
	}
	if es, _ := os.ReadDir(outside); len(es) != 1 {
		t.Errorf("outside dir holds %d entries, want the secret only", len(es))
	}
}

// TestRootFS_Operations runs each path operation of the guest's file
// system once and checks the host directory.
func TestRootFS_Operations(t *testing.T) {
	root := t.TempDir()
	writeFile(t, root, "d/f", "content")
	steps := []struct {
		args  []string
		check func() error
	}{
		{[]string{"mv", "/d/f", "/d/g"}, func() error {
			_, err := os.Stat(filepath.Join(root, "d/g"))
			return err
		}},
		{[]string{"link", "/d/g", "/hard"}, func() error {
			a, _ := os.Stat(filepath.Join(root, "d/g"))
			b, err := os.Stat(filepath.Join(root, "hard"))
			if err == nil && !os.SameFile(a, b) {
				err = errors.New("not the same inode")
			}
			return err
		}},
		{[]string{"chtimes", "/hard", "1000000000"}, func() error {
			fi, err := os.Stat(filepath.Join(root, "d/g"))
			if err == nil && fi.ModTime().Unix() != 1000000000 {
				err = fmt.Errorf("mtime %v", fi.ModTime())
			}
			return err
		}},
		{[]string{"mkdir", "/e"}, nil},
		{[]string{"mv", "/e", "/d/e"}, func() error {
			fi, err := os.Stat(filepath.Join(root, "d/e"))
			if err == nil && !fi.IsDir() {
				err = errors.New("not a directory")
			}
			return err
		}},
		{[]string{"rm", "/d/e"}, func() error {
			if _, err := os.Stat(filepath.Join(root, "d/e")); !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("still there: %v", err)
			}
			return nil
		}},
	}
	for _, s := range steps {
		o := runGuest(t, context.Background(), wasi.Spec{Root: root}, s.args...)
		if o.err != nil || o.res.ExitCode != 0 {
			t.Fatalf("%v: %v, exit %d, %q", s.args, o.err, o.res.ExitCode, o.stderr)
		}
		if s.check != nil {
			if err := s.check(); err != nil {
				t.Errorf("%v: %v", s.args, err)
			}
		}
	}
	o := runGuest(t, context.Background(), wasi.Spec{Root: root}, "stat", "/d/g")
	if o.err != nil || o.stdout != "---------- 7 1000000000\n" {
		t.Errorf("stat: %v, %q, %q", o.err, o.stdout, o.stderr)
	}
	// A large directory is listed whole (fd_readdir resumes with cookies
	// across several calls).
	for i := range 3000 {
		writeFile(t, root, fmt.Sprintf("big/%04d-%s", i, strings.Repeat("n", 40)), "")
	}
	o = runGuest(t, context.Background(), wasi.Spec{Root: root}, "ls", "/big")
	if o.err != nil || o.res.ExitCode != 0 {
		t.Fatalf("ls: %v, %q", o.err, o.stderr)
	}
	if names := strings.Split(strings.TrimSpace(o.stdout), "\n"); len(names) != 3000 || names[2999] != "2999-"+strings.Repeat("n", 40) {
		t.Errorf("ls listed %d names", len(names))
	}
}

func TestRun_ReadOnlyMount(t *testing.T) {
	root := t.TempDir()
	data := t.TempDir()
	writeFile(t, data, "f.txt", "data")
	spec := wasi.Spec{Root: root, ExtraReadOnly: map[string]string{"/data": data}}
	o := runGuest(t, context.Background(), spec, "read", "/data/f.txt")
	if o.err != nil || o.res.ExitCode != 0 || o.stdout != "data" {
		t.Fatalf("read: %v, exit %d, %q, %q", o.err, o.res.ExitCode, o.stdout, o.stderr)
	}
	for _, args := range [][]string{
		{"write", "/data/new.txt", "x"},
		{"write", "/data/f.txt", "x"},
		{"mkdir", "/data/d"},
		{"rm", "/data/f.txt"},
		{"symlink", "f.txt", "/data/l"},
	} {
		o := runGuest(t, context.Background(), spec, args...)
		if o.err != nil {
			t.Fatalf("%v: %v", args, o.err)
		}
		if o.res.ExitCode == 0 {
			t.Errorf("%v succeeded on a read-only mount", args)
		} else if !strings.Contains(strings.ToLower(o.stderr), "read-only file system") {
			t.Errorf("%v: stderr %q, want EROFS", args, o.stderr)
		}
	}
	es, err := os.ReadDir(data)
	if err != nil || len(es) != 1 {
		t.Fatalf("mount source now holds %v, %v", es, err)
	}
	if b, _ := os.ReadFile(filepath.Join(data, "f.txt")); string(b) != "data" {
		t.Errorf("f.txt is now %q", b)
	}
	// The root stays writable alongside.
	if o := runGuest(t, context.Background(), spec, "write", "/w.txt", "ok"); o.err != nil || o.res.ExitCode != 0 {
		t.Errorf("write to root: %v, %q", o.err, o.stderr)
	}
}

func TestRun_RealClock(t *testing.T) {
	before := time.Now()
	o := runGuest(t, context.Background(), wasi.Spec{}, "time")
	if o.err != nil || o.res.ExitCode != 0 {
		t.Fatalf("Run: %v, %q", o.err, o.stderr)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(o.stdout), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if got := time.Unix(0, ns); got.Before(before.Add(-time.Second)) || got.After(time.Now().Add(time.Second)) {
		t.Errorf("guest clock %v, host %v", got, before)
	}
}

func TestRun_Concurrent(t *testing.T) {
	noLeak(t)
	wasitest.Guest(t)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			in := strings.Repeat(fmt.Sprintf("run %d\n", i), 1000)
			o := runGuest(t, context.Background(), wasi.Spec{Stdin: strings.NewReader(in)}, "echo")
			if o.err != nil || o.stdout != in {
				t.Errorf("run %d: %v, %d bytes out", i, o.err, len(o.stdout))
			}
		})
	}
	wg.Wait()
}

func TestRuntime_CompilesOnce(t *testing.T) {
	noLeak(t)
	dir := t.TempDir()
	r := newRuntime(t, wasi.Options{CacheDir: dir})
	mod := wasitest.ExitModule(42)
	var wg sync.WaitGroup
	var mu sync.Mutex
	compiled := 0
	for range 6 {
		wg.Go(func() {
			o := run(t, r, context.Background(), wasi.Spec{Module: mod})
			if o.err != nil || o.res.ExitCode != 42 {
				t.Errorf("Run: %v, exit %d", o.err, o.res.ExitCode)
			}
			mu.Lock()
			if o.res.Compiled {
				compiled++
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if compiled != 1 {
		t.Errorf("%d of 6 concurrent runs compiled the module, want 1", compiled)
	}
	if o := run(t, r, context.Background(), wasi.Spec{Module: mod}); o.res.Compiled {
		t.Error("a later run compiled again")
	}
	if es, err := os.ReadDir(dir); err != nil || len(es) == 0 {
		t.Errorf("compilation cache dir is empty (%v)", err)
	}
}

func TestRuntime_EvictsUnused(t *testing.T) {
	r := newRuntime(t, wasi.Options{MaxCompiled: 1})
	a, b := wasitest.ExitModule(1), wasitest.ExitModule(2)
	for i, tc := range []struct {
		mod          []byte
		wantCompiled bool
	}{{a, true}, {a, false}, {b, true}, {a, true}} {
		o := run(t, r, context.Background(), wasi.Spec{Module: tc.mod})
		if o.err != nil {
			t.Fatal(o.err)
		}
		if o.res.Compiled != tc.wantCompiled {
			t.Errorf("run %d: compiled %v, want %v", i, o.res.Compiled, tc.wantCompiled)
		}
	}
}

// TestRuntime_DiskCacheSurvivesRestart: a second Runtime on the shared
// runtime's CacheDir loads the guest's machine code instead of compiling
// it (timings logged).
func TestRuntime_DiskCacheSurvivesRestart(t *testing.T) {
	if o := runGuest(t, context.Background(), wasi.Spec{}, "exit", "0"); o.err != nil {
		t.Fatal(o.err)
	}
	guestCompile.Lock()
	cold := guestCompile.d
	guestCompile.Unlock()
	r := newRuntime(t, wasi.Options{CacheDir: sharedCacheDir})
	o := run(t, r, context.Background(), wasi.Spec{Module: wasitest.Guest(t), Args: []string{"guest", "exit", "0"}})
	if o.err != nil || !o.res.Compiled {
		t.Fatalf("run: %v, %+v", o.err, o.res)
	}
	t.Logf("guest compile with an empty cache dir %v, after a restart %v", cold, o.res.Compile)
	if o.res.Compile >= cold {
		t.Errorf("loading from the cache dir (%v) was no faster than compiling (%v)", o.res.Compile, cold)
	}
}

func TestRuntime_Close(t *testing.T) {
	noLeak(t)
	r, err := wasi.New(context.Background(), wasi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	spin := wasi.Spec{Module: wasitest.LoopModule(), Root: t.TempDir()}
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		close(started)
		_, err := r.Run(context.Background(), spin)
		done <- err
	}()
	<-started
	time.Sleep(200 * time.Millisecond) // let it reach the loop
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, wasi.ErrUnavailable) {
			t.Errorf("running module after Close: %v, want ErrUnavailable", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close did not stop a running module")
	}
	if _, err := r.Run(context.Background(), spin); !errors.Is(err, wasi.ErrUnavailable) {
		t.Errorf("Run after Close: %v", err)
	}
	if err := r.Close(context.Background()); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestOptions_Validate(t *testing.T) {
	for _, o := range []wasi.Options{
		{MaxCompiled: -1},
		{DefaultMemoryLimitPages: wasi.MaxMemoryLimitPages + 1},
		{CompileWorkers: -2},
	} {
		if _, err := wasi.New(context.Background(), o); !errors.Is(err, wasi.ErrInvalidArgument) {
			t.Errorf("New(%+v): %v", o, err)
		}
	}
}

func TestReadModule(t *testing.T) {
	outside := t.TempDir()
	writeFile(t, outside, "host.wasm", "HOST")
	root := t.TempDir()
	mod := wasitest.ExitModule(5)
	writeFile(t, root, "bin/tool.wasm", string(mod))
	if err := os.Symlink("/bin/tool.wasm", filepath.Join(root, "abs.wasm")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "host.wasm"), filepath.Join(root, "escape.wasm")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "fifo.wasm"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want error
	}{
		{"/bin/tool.wasm", nil},
		{"bin/tool.wasm", nil},
		{"/abs.wasm", nil},
		{"/escape.wasm", wasi.ErrNotFound}, // resolves to <root>/<outside>/host.wasm
		{"/../../../../" + outside + "/host.wasm", wasi.ErrNotFound},
		{"/missing.wasm", wasi.ErrNotFound},
		{"/bin", wasi.ErrInvalidArgument},
		{"/fifo.wasm", wasi.ErrInvalidArgument},
	} {
		b, err := wasi.ReadModule(root, tc.path)
		if tc.want != nil {
			if !errors.Is(err, tc.want) {
				t.Errorf("ReadModule(%q): %v, want %v", tc.path, err, tc.want)
			}
			continue
		}
		if err != nil || !bytes.Equal(b, mod) {
			t.Errorf("ReadModule(%q): %d bytes, %v", tc.path, len(b), err)
		}
	}
	if _, err := wasi.ReadModule(filepath.Join(root, "nope"), "/x"); !errors.Is(err, wasi.ErrNotFound) {
		t.Errorf("missing root: %v", err)
	}
}

// TestRun_MemoryBudget: the runs of one Runtime share Options.MemoryBudget.
// A minimum above the whole budget is refused at once; a run whose limit
// does not fit now waits its turn; concurrent guests that together want
// more than the budget run in turn, never over it; and everything is given
// back when the runs end.
func TestRun_MemoryBudget(t *testing.T) {
	noLeak(t)
	const budget = 96 << 20
	r := newRuntime(t, wasi.Options{MemoryBudget: budget})
	t.Run("minimum above the budget", func(t *testing.T) {
		mod := wasitest.Module{MemMin: 2048, ExportMemory: true}.Bytes() // 128 MiB
		o := run(t, r, context.Background(), wasi.Spec{Module: mod})
		if !errors.Is(o.err, wasi.ErrQuotaExceeded) || !strings.Contains(o.err.Error(), "budget") {
			t.Fatalf("Run: %v, want ErrQuotaExceeded naming the budget", o.err)
		}
	})
	t.Run("queued", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		loop := wasitest.Module{MemMin: 960, ExportMemory: true, Start: []byte{0x03, 0x40, 0x0c, 0x00, 0x0b}}.Bytes() // 60 MiB, spins
		first := make(chan outcome, 1)
		go func() { first <- run(t, r, ctx, wasi.Spec{Module: loop}) }()
		waitStats(t, r, func(s wasi.MemoryStats) bool { return s.InUse >= 60<<20 })
		second := make(chan outcome, 1)
		exit := wasitest.Module{ImportExit: true, MemMin: 960, ExportMemory: true,
			Start: append(wasitest.I32Const(7), 0x10, 0)}.Bytes()
		go func() { second <- run(t, r, context.Background(), wasi.Spec{Module: exit}) }()
		waitStats(t, r, func(s wasi.MemoryStats) bool { return s.Waiting == 1 })
		select {
		case o := <-second:
			t.Fatalf("second run did not wait for memory: %+v", o)
		default:
		}
		cancel()
		if o := <-first; !errors.Is(o.err, context.Canceled) {
			t.Fatalf("first run: %v", o.err)
		}
		if o := <-second; o.err != nil || o.res.ExitCode != 7 {
			t.Fatalf("second run after the first ended: %v, exit %d", o.err, o.res.ExitCode)
		}
	})
	t.Run("concurrent guests", func(t *testing.T) {
		mod := wasitest.Guest(t)
		const runs = 3
		outs := make(chan outcome, runs)
		for range runs {
			go func() {
				outs <- run(t, r, context.Background(), wasi.Spec{Module: mod, Args: []string{"guest", "alloc", "40"}})
			}()
		}
		ok := 0
		for range runs {
			o := <-outs
			switch {
			case o.err == nil && o.stdout == "40\n":
				ok++
			case errors.Is(o.err, wasi.ErrQuotaExceeded) && strings.Contains(o.err.Error(), "budget"):
				t.Logf("refused: %v", o.err)
			default:
				t.Errorf("Run: %v, exit %d, stdout %q, stderr %q", o.err, o.res.ExitCode, o.stdout, o.stderr)
			}
		}
		// Each takes its limit (here the whole budget) before it starts:
		// they run one after the other, and all of them finish.
		if ok != runs {
			t.Errorf("%d of %d runs finished; queued runs must all fit in turn", ok, runs)
		}
	})
	s := r.MemoryStats()
	if s.Budget != budget || s.InUse != 0 || s.Waiting != 0 || s.Peak > budget || s.Peak == 0 {
		t.Fatalf("after the runs: %+v; want nothing in use and a peak within the budget", s)
	}
}

func waitStats(t *testing.T, r *wasi.Runtime, cond func(wasi.MemoryStats) bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond(r.MemoryStats()) {
		if time.Now().After(deadline) {
			t.Fatalf("memory stats never got there: %+v", r.MemoryStats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
