package fusefs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/internal/testenv"
)

// A directory position past the end of a listing reads as the end, as on
// a disk file system: getdents answers nothing, not an error. The kernel
// asks the server for any position its cached listing does not hold.
func TestHandlelessSeekPastEnd(t *testing.T) {
	st := newCountingStore()
	root, _ := buildDirs(t, st, 1, 300, true)
	f, mnt := mount(t, st, root)
	dir := filepath.Join(mnt, "d00", "sub")
	if names, err := listSmall(dir, false); err != nil || len(names) != 300 {
		t.Fatalf("%d names (%v), want 300", len(names), err)
	}
	kernelHasNoOpendir(t, f)
	for _, drop := range []bool{false, true} {
		if drop {
			dropCaches(t)
		}
		for _, off := range []int64{301, 1 << 20, 1 << 40} {
			fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := unix.Seek(fd, off, 0); err != nil {
				t.Fatal(err)
			}
			names, err := readNames(fd, 4096, -1)
			unix.Close(fd)
			if err != nil || len(names) != 0 {
				t.Errorf("drop=%v: getdents at %d: %d names, %v; want the end of the listing", drop, off, len(names), err)
			}
		}
	}
}

// An overlay on the projection (an attempt root) lists merged directories
// right: lower entries read through handle-0 READDIRs, upper entries,
// whiteouts of deleted lower files, an opaque directory that replaced a
// lower one, copied-up files; again after the kernel forgot the lower
// inodes.
func TestHandlelessOverlayMergedListings(t *testing.T) {
	st := newCountingStore()
	root, want := buildDirs(t, st, 3, 400, true)
	f, lower := mount(t, st, root)
	dir := t.TempDir()
	upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, "lowerdir="+lower+",upperdir="+upper+",workdir="+work); err != nil {
		testenv.Require(t, "overlay")
		t.Fatalf("overlay mount: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(merged, 0); err != nil {
			t.Errorf("unmount overlay: %v", err)
		}
	})
	set := map[string]bool{}
	for _, p := range want {
		set[p] = true
	}
	pad := strings.Repeat("n", 150)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Whiteouts: every third file of d00/sub.
	for i := 0; i < 400; i += 3 {
		p := filepath.Join("d00", "sub", "f"+pad5(i)+pad)
		must(os.Remove(filepath.Join(merged, p)))
		delete(set, p)
	}
	// Copy-ups: every fifth file of d01/sub, and a new file among them.
	for i := 0; i < 400; i += 5 {
		must(os.Chmod(filepath.Join(merged, "d01", "sub", "f"+pad5(i)+pad), 0o600))
	}
	must(os.WriteFile(filepath.Join(merged, "d01", "sub", "new"), nil, 0o644))
	set["d01/sub/new"] = true
	// Opaque: d02/sub replaced by a new directory with one file.
	must(os.RemoveAll(filepath.Join(merged, "d02", "sub")))
	for p := range set {
		if strings.HasPrefix(p, "d02/sub/") {
			delete(set, p)
		}
	}
	must(os.Mkdir(filepath.Join(merged, "d02", "sub"), 0o755))
	must(os.WriteFile(filepath.Join(merged, "d02", "sub", "only"), nil, 0o644))
	set["d02/sub/only"] = true
	var expect []string
	for p := range set {
		expect = append(expect, p)
	}
	slices.Sort(expect)
	for _, drop := range []bool{false, true, false} {
		if drop {
			dropCaches(t)
			// The overlay's own dentries go too: 3 drops the page cache,
			// listings of merged dirs included.
			must(os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0))
		}
		if got := walk(t, merged); !slices.Equal(got, expect) {
			t.Errorf("drop=%v: %d paths, want %d (first difference %q)", drop, len(got), len(expect), firstDiff(got, expect))
		}
	}
	kernelHasNoOpendir(t, f)
}

func pad5(i int) string { return strings.Repeat("0", 5-len(itoa(i))) + itoa(i) }

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return a[i] + " vs " + b[i]
		}
	}
	return "length"
}
