package walkertest_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/ingest"
	"github.com/esf-dev/esf/internal/walker/walkertest"
	"github.com/esf-dev/esf/wasi"
)

// fixture builds a root with what FR-07 asks for (nested directories,
// symlinks, modes, large and empty files) and the awkward cases: special
// bits, names that need quoting, a hard link, a FIFO, a device when root,
// and paths the default skip list leaves out.
func fixture(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	large := make([]byte, 5<<20+3)
	for i := range large {
		large[i] = byte(i*7 + i>>11)
	}
	type node struct {
		path    string
		mode    uint32 // raw bits, applied with chmod(2) so umask does not interfere
		content []byte
		dir     bool
	}
	for _, n := range []node{
		{path: "", mode: 0o751, dir: true},
		{path: "a", mode: 0o755, dir: true},
		{path: "a/b", mode: 0o700, dir: true},
		{path: "a/b/c", mode: 0o755, dir: true},
		{path: "a/b/c/deep.txt", mode: 0o644, content: []byte("deep\n")},
		{path: "tmp", mode: 0o1777, dir: true},
		{path: "shared", mode: 0o2775, dir: true},
		{path: "empty", mode: 0o644, content: []byte{}},
		{path: "large.bin", mode: 0o640, content: large},
		{path: "setuid", mode: 0o4755, content: []byte("#!/bin/true\n")},
		{path: "setgid", mode: 0o2711, content: []byte("g")},
		{path: "secret", mode: 0o600, content: []byte("s")},
		{path: "none", mode: 0, content: []byte("unreadable to anyone but root")},
		{path: "tab\there", mode: 0o644, content: []byte("t")},
		{path: "new\nline", mode: 0o644, content: []byte("n")},
		{path: "ünï cödé \"q\"", mode: 0o644, content: []byte("u")},
		{path: "proc", mode: 0o555, dir: true},
		{path: "proc/1", mode: 0o644, content: []byte("skipped")},
		{path: "procfs", mode: 0o644, content: []byte("not skipped")},
		{path: ".esf", mode: 0o755, dir: true},
		{path: ".esf/init", mode: 0o755, content: []byte("skipped")},
	} {
		p := filepath.Join(root, n.path)
		var err error
		if n.dir {
			err = os.Mkdir(p, 0o700)
		} else {
			err = os.WriteFile(p, n.content, 0o600)
		}
		if err == nil {
			err = unix.Chmod(p, n.mode)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"rel":          "a/b/c/deep.txt",
		"abs":          "/a/b",
		"dangling":     "nowhere/at/all",
		"a/b/up":       "../../large.bin",
		"loop":         "loop",
		"long":         strings.Repeat("x/", 300) + "end",
		"tmp/odd link": "tab\there",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(root, "a/b/c/deep.txt"), filepath.Join(root, "hardlink")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(root, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(filepath.Join(root, "fifo"), 0o620); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(root, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Logf("no device node in the fixture: %v", err)
	}
	return root
}

func importTree(t *testing.T, root string) (*mem.Store, cas.ID) {
	t.Helper()
	st := mem.New()
	res, err := ingest.Dir(context.Background(), st, root, ingest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return st, res.Root
}

func runLinux(t *testing.T, args ...string) []byte {
	t.Helper()
	bin := walkertest.Build(t, "linux")
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("walker %q: %v\n%s", args, err, stderr.Bytes())
	}
	return stdout.Bytes()
}

func parse(t *testing.T, out []byte) []walkertest.Line {
	t.Helper()
	lines, err := walkertest.Parse(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// Format is the inverse of Parse on the walker's own output.
	if again := walkertest.Format(lines); !bytes.Equal(again, out) {
		t.Fatalf("Format(Parse(out)) differs from out:\n%s\n---\n%s", again, out)
	}
	return lines
}

// TestWalker_LinuxMatchesTree: the Linux walker on a directory prints
// what FromTree renders from that directory's import.
func TestWalker_LinuxMatchesTree(t *testing.T) {
	root := fixture(t)
	st, id := importTree(t, root)
	for _, tc := range []struct {
		name     string
		args     []string
		opts     walkertest.Options
		portable bool
	}{
		{"default skip", walkertest.Args(root, false, walkertest.DefaultSkip), walkertest.Options{}, false},
		{"skip nothing", walkertest.Args(root, false, nil), walkertest.Options{Skip: []string{}}, false},
		{"portable", walkertest.Args(root, true, walkertest.DefaultSkip), walkertest.Options{}, true},
		{"sha256", append([]string{"-hash", "sha256"}, walkertest.Args(root, false, walkertest.DefaultSkip)...), walkertest.Options{SHA256: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := walkertest.FromTree(context.Background(), st, id, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if tc.portable {
				want = walkertest.Portable(want)
			}
			got := parse(t, runLinux(t, tc.args...))
			if d := walkertest.Diff(want, got); d != "" {
				t.Errorf("walker output differs from the tree:\n%s", d)
			}
		})
	}
}

// TestWalker_SkipAndQuoting pins details of the format on a few lines.
func TestWalker_SkipAndQuoting(t *testing.T) {
	root := fixture(t)
	lines := parse(t, runLinux(t, walkertest.Args(root, false, walkertest.DefaultSkip)...))
	byPath := map[string]walkertest.Line{}
	for _, l := range lines {
		byPath[l.Path] = l
	}
	for _, p := range []string{"/proc", "/proc/1", "/.esf", "/.esf/init"} {
		if _, ok := byPath[p]; ok {
			t.Errorf("%s listed despite -skip", p)
		}
	}
	for p, want := range map[string]walkertest.Line{
		"/":          {Path: "/", Type: "dir", Size: -1, Mode: 0o751},
		"/procfs":    {Path: "/procfs", Type: "file", Size: 11, Mode: 0o644, Hash: cas.Sum([]byte("not skipped")).String()},
		"/tmp":       {Path: "/tmp", Type: "dir", Size: -1, Mode: 0o1777},
		"/setuid":    {Path: "/setuid", Type: "file", Size: 12, Mode: 0o4755, Hash: cas.Sum([]byte("#!/bin/true\n")).String()},
		"/new\nline": {Path: "/new\nline", Type: "file", Size: 1, Mode: 0o644, Hash: cas.Sum([]byte("n")).String()},
		"/abs":       {Path: "/abs", Type: "symlink", Size: 4, Mode: -1, Target: "/a/b"},
		"/fifo":      {Path: "/fifo", Type: "fifo", Size: -1, Mode: 0o620},
		"/empty":     {Path: "/empty", Type: "file", Size: 0, Mode: 0o644, Hash: cas.Sum(nil).String()},
	} {
		if got := byPath[p]; got != want {
			t.Errorf("%q:\n got  %s\n want %s", p, got, want)
		}
	}
}

// TestWalker_WasmMatchesTree is FR-07 without runc and overlay: the
// wasip1 walker under wasi.Runtime, with the directory as its root, prints
// the portable view of the tree, which is also what the Linux walker
// prints with -portable.
func TestWalker_WasmMatchesTree(t *testing.T) {
	root := fixture(t)
	st, id := importTree(t, root)
	want, err := walkertest.FromTree(context.Background(), st, id, walkertest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want = walkertest.Portable(want)

	rt, err := wasi.New(context.Background(), wasi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(context.Background())
	var stdout, stderr bytes.Buffer
	res, err := rt.Run(context.Background(), wasi.Spec{
		Module: walkertest.Wasm(t),
		Args:   append([]string{"walker"}, walkertest.Args("/", false, walkertest.DefaultSkip)...),
		Root:   root,
		Stdout: &stdout,
		Stderr: &stderr,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("wasm walker: %v, exit %d\n%s", err, res.ExitCode, stderr.Bytes())
	}
	got := parse(t, stdout.Bytes())
	if d := walkertest.Diff(want, got); d != "" {
		t.Errorf("wasm walker differs from the tree:\n%s", d)
	}
	linux := parse(t, runLinux(t, walkertest.Args(root, true, walkertest.DefaultSkip)...))
	if d := walkertest.Diff(linux, got); d != "" {
		t.Errorf("wasm walker differs from the Linux walker:\n%s", d)
	}
}

func TestWalker_FailsLoudly(t *testing.T) {
	bin := walkertest.Build(t, "linux")
	for _, args := range [][]string{
		{filepath.Join(t.TempDir(), "missing")},
		{"-hash", "md5", t.TempDir()},
		{t.TempDir(), t.TempDir()},
	} {
		var stderr bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 || stderr.Len() == 0 {
			t.Errorf("walker %q: %v, stderr %q; want a non-zero exit with a message", args, err, stderr.String())
		}
	}
}

func TestParse_Rejects(t *testing.T) {
	h := strings.Repeat("ab", 32)
	for _, in := range []string{
		"\"/\"\tdir\t-\t0755\t-\t-",                          // unterminated
		"/\tdir\t-\t0755\t-\t-\n",                            // path not quoted
		"\"rel\"\tdir\t-\t0755\t-\t-\n",                      // not absolute
		"\"/\"\tdir\t5\t0755\t-\t-\n",                        // size for a dir
		"\"/f\"\tfile\t-\t0644\t-\t" + h + "\n",              // no size for a file
		"\"/f\"\tfile\t1\t0644\t-\t-\n",                      // no hash for a file
		"\"/f\"\tfile\t1\t0644\t-\tabc\n",                    // short hash
		"\"/f\"\tfile\t1\t9999\t-\t" + h + "\n",              // bad mode
		"\"/l\"\tsymlink\t2\t0777\t\"ab\"\t-\n",              // mode for a symlink
		"\"/l\"\tsymlink\t3\t-\t\"ab\"\t-\n",                 // size is not the target length
		"\"/x\"\twhat\t-\t-\t-\t-\n",                         // unknown type
		"\"/b\"\tdir\t-\t-\t-\t-\n\"/a\"\tdir\t-\t-\t-\t-\n", // out of order
		"\"/a\"\tdir\t-\t-\t-\n",                             // five fields
	} {
		if lines, err := walkertest.Parse([]byte(in)); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", in, lines)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("\"/\"\tdir\t-\t0755\t-\t-\n\"/a\"\tsymlink\t1\t-\t\"b\"\t-\n"))
	f.Add([]byte("\"/f\"\tfile\t0\t-\t-\t" + strings.Repeat("0", 64) + "\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		lines, err := walkertest.Parse(in)
		if err != nil {
			return
		}
		// What parses is exactly what Format prints.
		if out := walkertest.Format(lines); !bytes.Equal(out, in) {
			t.Fatalf("Format(Parse(%q)) = %q", in, out)
		}
	})
}
