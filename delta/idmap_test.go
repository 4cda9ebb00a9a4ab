package delta

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestIDMappedDelta: through an idmapped delta, the tree's root-owned files
// belong to the map's first host id, and what host ids of the range write
// lands in the upper directory under the sandbox's own ids (0 for the
// sandbox's root), copy-ups included.
func TestIDMappedDelta(t *testing.T) {
	_, _, lower := projected(t, map[string]string{"a.txt": "base a", "d/b.txt": "base b"})
	m, err := NewIDMap(1<<30, 65536)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	dir := t.TempDir()
	os.Chmod(dir, 0o755) // the sandbox's users enter the root
	os.Chmod(filepath.Dir(dir), 0o755)
	l := Layout{Lower: lower, Dir: filepath.Join(dir, "delta"), Root: filepath.Join(dir, "root"), IDMap: m}
	if err := Mount(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Remove(l); err != nil {
			t.Errorf("remove delta: %v", err)
		}
	})
	owner := func(p string) (uint32, uint32) {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid, st.Gid
	}
	if u, g := owner(filepath.Join(l.Root, "a.txt")); u != m.Start || g != m.Start {
		t.Fatalf("a root-owned lower file shows as %d:%d through the mount, want %d:%d", u, g, m.Start, m.Start)
	}
	if u, _ := owner(l.Root); u != m.Start {
		t.Fatalf("the root directory shows as owned by %d, want %d", u, m.Start)
	}
	as := func(uid uint32, script string) {
		t.Helper()
		cmd := exec.Command("sh", "-c", script)
		cmd.Dir = l.Root
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("as %d: %s: %v: %s", uid, script, err, out)
		}
	}
	as(m.Start, "echo new > new.txt && echo more >> a.txt && mkdir home")
	// The sandbox's root would chown to its uid 1000: host id Start+1000.
	if err := os.Chown(filepath.Join(l.Root, "home"), int(m.Start)+1000, int(m.Start)+1000); err != nil {
		t.Fatal(err)
	}
	as(m.Start+1000, "echo mine > home/mine.txt")
	for p, want := range map[string]uint32{"new.txt": 0, "a.txt": 0, "home": 1000, "home/mine.txt": 1000} {
		if u, g := owner(filepath.Join(l.Upper(), p)); u != want || g != want {
			t.Errorf("upper %s owned by %d:%d, want %d:%d (the sandbox's ids)", p, u, g, want, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(l.Upper(), "a.txt")); err != nil || string(b) != "base amore\n" {
		t.Errorf("copied-up a.txt = %q, %v", b, err)
	}
	if opts := mountOptions(t, IDMappedSource(l.Dir)); opts == "" {
		t.Errorf("mountinfo does not name the delta as %s", IDMappedSource(l.Dir))
	} else if strings.Contains(opts, "nosuid") {
		t.Errorf("a private idmapped root is mounted %s, want suid semantics for the sandbox", opts)
	}
}

// mountOptions is the per-mount options of the mount whose source is
// source ("" if none).
func mountOptions(t *testing.T, source string) string {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(mi), "\n") {
		f := strings.Fields(line)
		for i, x := range f {
			if x == "-" && i+2 < len(f) && f[i+2] == source {
				return f[5]
			}
		}
	}
	return ""
}

// TestIDMappedHostView: an idmapped root the caller places on the host is
// nosuid,nodev like any host view.
func TestIDMappedHostView(t *testing.T) {
	_, _, lower := projected(t, map[string]string{"a.txt": "a"})
	m, err := NewIDMap(1<<30, 65536)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	dir := t.TempDir()
	l := Layout{Lower: lower, Dir: filepath.Join(dir, "delta"), Root: filepath.Join(dir, "root"), IDMap: m, HostView: true}
	if err := Mount(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Remove(l); err != nil {
			t.Errorf("remove delta: %v", err)
		}
	})
	opts := mountOptions(t, IDMappedSource(l.Dir))
	if !strings.Contains(opts, "nosuid") || !strings.Contains(opts, "nodev") {
		t.Fatalf("an idmapped host view is mounted %q, want nosuid,nodev", opts)
	}
}
