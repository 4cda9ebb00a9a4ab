package ingest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/internal/testenv"
)

// makeSparse creates p with size bytes, data written at each offset of
// data (4 KiB-aligned offsets, short writes) and holes everywhere else.
// It returns the file's bytes.
func makeSparse(t *testing.T, p string, size int64, data map[int64]string) []byte {
	t.Helper()
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	must(t, f.Truncate(size))
	content := make([]byte, size)
	for off, s := range data {
		_, err := f.WriteAt([]byte(s), off)
		must(t, err)
		copy(content[off:], s)
	}
	return content
}

// sourceHoles asks the filesystem where p's holes are, the way a reader
// of the directory would.
func sourceHoles(t *testing.T, p string) []cas.Hole {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY, 0)
	must(t, err)
	defer unix.Close(fd)
	var hs []cas.Hole
	var st unix.Stat_t
	must(t, unix.Fstat(fd, &st))
	for pos := int64(0); pos < st.Size; {
		hole, err := unix.Seek(fd, pos, unix.SEEK_HOLE)
		must(t, err)
		if hole >= st.Size {
			break
		}
		data, err := unix.Seek(fd, hole, unix.SEEK_DATA)
		if err == unix.ENXIO {
			data = st.Size
		} else {
			must(t, err)
		}
		hs = append(hs, cas.Hole{Off: hole, Len: data - hole})
		pos = data
	}
	return hs
}

// A directory import records each file's holes as its filesystem reports
// them, on every content path (small files read whole, large ones hashed
// first or streamed), and names the same blob as the dense bytes would.
func TestDirRecordsHoles(t *testing.T) {
	root := t.TempDir()
	const big = 3<<20 + 1
	files := map[string][]byte{
		"big":       makeSparse(t, filepath.Join(root, "big"), big, map[int64]string{1 << 20: "data at 1 MiB", big - 1: "x"}),
		"small":     makeSparse(t, filepath.Join(root, "small"), 512<<10, map[int64]string{0: "head"}),
		"all-hole":  makeSparse(t, filepath.Join(root, "all-hole"), 2<<20, nil),
		"dense":     make([]byte, 64<<10),
		"zero-size": nil,
	}
	writeFile(t, filepath.Join(root, "dense"), files["dense"], 0o644)
	writeFile(t, filepath.Join(root, "zero-size"), nil, 0o644)
	want := map[string][]cas.Hole{}
	for name := range files {
		want[name] = sourceHoles(t, filepath.Join(root, name))
	}
	if len(want["big"]) != 2 || len(want["small"]) != 1 || len(want["all-hole"]) != 1 {
		t.Fatalf("the test directory's filesystem keeps no holes: %v", want)
	}
	for _, opts := range []Options{{}, {NewContent: true}} {
		st := newStore()
		for range 2 { // the second import finds the content stored
			res, err := Dir(context.Background(), st, root, opts)
			must(t, err)
			es := flatten(t, st, res.Root)
			for name, content := range files {
				e := es[name]
				if e.ID != cas.Sum(content) || e.Size != int64(len(content)) {
					t.Errorf("%s (new content %v): id or size differ from the dense bytes'", name, opts.NewContent)
				}
				if !slices.Equal(e.Holes, want[name]) {
					t.Errorf("%s (new content %v): holes %v, want %v", name, opts.NewContent, e.Holes, want[name])
				}
			}
		}
	}
}

// A seal reads holes from the upper directory like an import does.
func TestUpperRecordsHoles(t *testing.T) {
	ctx := context.Background()
	st := newStore()
	base, err := Dir(ctx, st, t.TempDir(), Options{})
	must(t, err)
	upper := t.TempDir()
	makeSparse(t, filepath.Join(upper, "s"), 4<<20, map[int64]string{2 << 20: "mid"})
	want := sourceHoles(t, filepath.Join(upper, "s"))
	if len(want) == 0 {
		t.Fatal("the test directory's filesystem keeps no holes")
	}
	res, err := Upper(ctx, st, base.Root, upper, Options{})
	must(t, err)
	if got := flatten(t, st, res.Root)["s"].Holes; !slices.Equal(got, want) {
		t.Fatalf("sealed holes %v, want %v", got, want)
	}
}

// A hole that reads as anything but zeros (the file was written while it
// was read) drops every hole of the file rather than record a lie.
func TestHoleCheck(t *testing.T) {
	content := make([]byte, 3<<20)
	holes := []cas.Hole{{Off: 0, Len: 1 << 20}, {Off: 2 << 20, Len: 1 << 20}}
	read := func(c *holeCheck) {
		buf := make([]byte, 100_000) // reads straddle the hole edges
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	}
	c := newHoleCheck(bytes.NewReader(content), holes, int64(len(content)))
	read(c)
	if got := c.result(int64(len(content))); !slices.Equal(got, holes) {
		t.Fatalf("zero holes: result %v", got)
	}
	if got := c.result(int64(len(content)) - 1); got != nil {
		t.Fatalf("holes kept for a size other than the mapped one: %v", got)
	}
	for _, off := range []int{0, 1<<20 - 1, 2 << 20, 3<<20 - 1} {
		bad := bytes.Clone(content)
		bad[off] = 1
		c := newHoleCheck(bytes.NewReader(bad), holes, int64(len(bad)))
		read(c)
		if got := c.result(int64(len(bad))); got != nil {
			t.Errorf("data at %d inside a hole: holes kept %v", off, got)
		}
	}
	// Data between holes is data.
	ok := bytes.Clone(content)
	ok[1<<20] = 1
	c = newHoleCheck(bytes.NewReader(ok), holes, int64(len(ok)))
	read(c)
	if c.result(int64(len(ok))) == nil {
		t.Error("data outside the holes dropped them")
	}
}

// A tar that stores sparse members (GNU tar --sparse, in each of its
// formats) imports to the same root as the directory it was made from:
// the holes come from the archive's sparse map, not from looking for zeros.
// Dense members stay dense, zeros and all.
func TestTarSparseMatchesDir(t *testing.T) {
	testenv.Require(t, "cmd:tar")
	root := t.TempDir()
	const big = 3<<20 + 1
	makeSparse(t, filepath.Join(root, "big"), big, map[int64]string{1 << 20: "data at 1 MiB", big - 1: "x"})
	makeSparse(t, filepath.Join(root, "small"), 512<<10, map[int64]string{64 << 10: "mid"})
	makeSparse(t, filepath.Join(root, "all-hole"), 2<<20, nil)
	writeFile(t, filepath.Join(root, "zeros"), make([]byte, 2<<20), 0o644) // dense
	if len(sourceHoles(t, filepath.Join(root, "big"))) == 0 {
		t.Fatal("the test directory's filesystem keeps no holes")
	}
	for _, p := range []string{"", "big", "small", "all-hole", "zeros"} {
		must(t, os.Chtimes(filepath.Join(root, p), time.Unix(1, 0), time.Unix(1, 0)))
	}
	ctx := context.Background()
	st := newStore()
	want, err := Dir(ctx, st, root, Options{})
	must(t, err)
	es := flatten(t, st, want.Root)
	if es["big"].Holes == nil || es["zeros"].Holes != nil {
		t.Fatalf("dir import: big holes %v, zeros holes %v", es["big"].Holes, es["zeros"].Holes)
	}
	for _, format := range []string{"posix", "gnu"} {
		t.Run(format, func(t *testing.T) {
			cmd := exec.Command("tar", "--format="+format, "--sparse", "--numeric-owner", "-C", root, "-cf", "-", ".")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			data, err := cmd.Output()
			if err != nil {
				t.Fatalf("tar: %v: %s", err, stderr.String())
			}
			if len(data) > 3<<20 { // 2 MiB of dense zeros, the rest sparse
				t.Fatalf("GNU tar wrote %d bytes: not sparse", len(data))
			}
			got, err := Tar(ctx, st, bytes.NewReader(data), Options{})
			must(t, err)
			if got.Root != want.Root {
				diffTrees(t, st, want.Root, got.Root)
				t.Fatalf("tar root %s, dir root %s", got.Root.Short(), want.Root.Short())
			}
		})
	}
}
