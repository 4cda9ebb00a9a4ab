package fusefs

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// Names at the length limit and with odd bytes list byte for byte through
// handle-0 READDIR and READDIRPLUS, in buffers that fit one entry or many,
// and each is found again by lstat.
func TestHandlelessOddNames(t *testing.T) {
	ctx := context.Background()
	st := newCountingStore()
	b := cas.NewBuilder(st, cas.ZeroID)
	blob := st.blob(t, "x")
	names := []string{
		strings.Repeat("a", 255),
		strings.Repeat("é", 127), // 254 bytes
		"new\nline", "tab\tand space ", "-dash", "\x01ctl", "bad\xffutf8", "..dots", "...",
		"a=b;c'd\"e", "\\back", "%s%n",
	}
	for i := range 300 {
		names = append(names, strings.Repeat("z", 200)+pad5(i))
	}
	for _, n := range names {
		if err := b.Put(ctx, "d/"+n, cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: 1, ID: blob}, ""); err != nil {
			t.Fatalf("put %q: %v", n, err)
		}
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(names)
	slices.Sort(want)
	f, mnt := mount(t, st, root)
	dir := filepath.Join(mnt, "d")
	for _, drop := range []bool{false, true} {
		if drop {
			dropCaches(t)
		}
		listings := f.Counters.Readdirs.Load()
		for _, size := range []int{300, 4096, 64 << 10} {
			fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			got, err := readNames(fd, size, -1)
			unix.Close(fd)
			if err != nil {
				t.Fatalf("drop=%v size %d: %v", drop, size, err)
			}
			got = slices.DeleteFunc(got, func(n string) bool { return n == "." || n == ".." })
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("drop=%v size %d: %d names, want %d (%q)", drop, size, len(got), len(want), firstDiff(got, want))
			}
		}
		// The first listing took many requests, each with a handle of its
		// own; .stats counts it once, and the kernel served the others.
		if n := f.Counters.Readdirs.Load() - listings; n != 1 {
			t.Errorf("drop=%v: %d listings counted, want 1", drop, n)
		}
		for _, n := range names {
			var s unix.Stat_t
			if err := unix.Lstat(filepath.Join(dir, n), &s); err != nil {
				t.Errorf("lstat %q: %v", n, err)
			}
		}
	}
	kernelHasNoOpendir(t, f)
}
