package ingest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
)

func TestTarEntries(t *testing.T) {
	mt := time.Unix(1700000000, 123456789)
	withPAX := func(e tarEntry, kv ...string) tarEntry {
		e.hdr.PAXRecords = map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			e.hdr.PAXRecords[kv[i]] = kv[i+1]
		}
		return e
	}
	root := dir("./")
	root.hdr.Mode, root.hdr.Uid, root.hdr.Gid, root.hdr.ModTime = 0o700, 5, 6, mt
	root = withPAX(root, "SCHILY.xattr.user.r", "root")
	abs := file("/abs/file", "absolute")
	abs.hdr.Uid, abs.hdr.Gid = 3000000, 4000000 // beyond ustar's octal fields
	x := withPAX(file("x", "xattrs"),
		"SCHILY.xattr.user.s", "schily",
		"LIBARCHIVE.xattr.user.lib%20x", base64.RawStdEncoding.EncodeToString([]byte("lib")),
		// bsdtar writes both forms; SCHILY wins.
		"LIBARCHIVE.xattr.user.s", base64.StdEncoding.EncodeToString([]byte("other")))
	x.hdr.ModTime = mt
	x.hdr.Mode = 0o104755 // type bits in the mode field are dropped
	sym := tarEntry{hdr: tar.Header{Name: "sym", Typeflag: tar.TypeSymlink, Linkname: "../up/target", Mode: 0o644}}
	hl := tarEntry{hdr: tar.Header{Name: "hl", Typeflag: tar.TypeLink, Linkname: "./abs/file"}}
	cdev := tarEntry{hdr: tar.Header{Name: "dev/c", Typeflag: tar.TypeChar, Devmajor: 4, Devminor: 64, Mode: 0o620}}
	bdev := tarEntry{hdr: tar.Header{Name: "dev/b", Typeflag: tar.TypeBlock, Devmajor: 8, Devminor: 1, Mode: 0o660}}
	fifo := tarEntry{hdr: tar.Header{Name: "dev/p", Typeflag: tar.TypeFifo, Mode: 0o600}}
	vol := tarEntry{hdr: tar.Header{Name: "label", Typeflag: 'V', Format: tar.FormatGNU}}
	ovr := dir("ovr/")

	data := makeTar(t,
		root, abs,
		file("a/./b//c", "cleaned"),
		file("x/../y", "dotdot inside"),
		x, sym, hl, cdev, bdev, fifo, vol,
		file("dup", "one"), file("dup", "two"),
		file("ovr", "a file first"), ovr, file("ovr/in", "then a dir"),
		file(".wh.plain", "not a whiteout outside layers"),
	)
	logger, logs := testLogger()
	st := newStore()
	res, err := Tar(context.Background(), st, bytes.NewReader(data), Options{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	es := flatten(t, st, res.Root)
	want := []string{"", ".wh.plain", "a", "a/b", "a/b/c", "abs", "abs/file", "dev", "dev/b", "dev/c", "dev/p",
		"dup", "hl", "ovr", "ovr/in", "sym", "x", "y"}
	if got := keys(es); !slices.Equal(got, want) {
		t.Fatalf("paths %q\nwant  %q", got, want)
	}
	if r := es[""]; r.Mode != 0o700 || r.UID != 5 || r.GID != 6 || r.MtimeNs != mt.UnixNano() ||
		len(r.Xattrs) != 1 || r.Xattrs[0].Name != "user.r" {
		t.Errorf("root = %+v", r)
	}
	if e := es["abs/file"]; e.UID != 3000000 || e.GID != 4000000 || string(blobOf(t, st, e.ID)) != "absolute" {
		t.Errorf("abs/file = %+v", e)
	}
	if e := es["x"]; e.Mode != 0o4755 || e.MtimeNs != mt.UnixNano() || len(e.Xattrs) != 2 ||
		e.Xattrs[0].Name != "user.lib x" || string(e.Xattrs[0].Value) != "lib" ||
		e.Xattrs[1].Name != "user.s" || string(e.Xattrs[1].Value) != "schily" {
		t.Errorf("x = %+v", e)
	}
	if e := es["sym"]; e.Type != cas.TypeSymlink || e.Target != "../up/target" || e.Mode != 0o777 {
		t.Errorf("sym = %+v", e)
	}
	if a, h := es["abs/file"], es["hl"]; h.ID != a.ID || a.LinkGroup != "abs/file" || h.LinkGroup != "abs/file" || h.Nlink != 2 {
		t.Errorf("hard link: abs/file %+v, hl %+v", a, h)
	}
	if e := es["dev/c"]; e.Type != cas.TypeCharDev || e.Major != 4 || e.Minor != 64 || e.Mode != 0o620 {
		t.Errorf("dev/c = %+v", e)
	}
	if e := es["dev/b"]; e.Type != cas.TypeBlockDev || e.Major != 8 || e.Minor != 1 {
		t.Errorf("dev/b = %+v", e)
	}
	if e := es["dev/p"]; e.Type != cas.TypeFIFO {
		t.Errorf("dev/p = %+v", e)
	}
	if e := es["dup"]; string(blobOf(t, st, e.ID)) != "two" {
		t.Error("a later entry did not replace an earlier one")
	}
	if e := es["ovr"]; e.Type != cas.TypeDir {
		t.Errorf("ovr = %+v", e)
	}
	if !slices.Equal(res.Skipped, []string{"label"}) || !strings.Contains(logs.String(), "label") {
		t.Errorf("Skipped %q, log %q", res.Skipped, logs.String())
	}
	// Implicit directories ("a", "dev") get cas.ImplicitDirAttr.
	if e := es["a"]; e.Mode != cas.ImplicitDirAttr.Mode {
		t.Errorf("implicit dir a = %+v", e)
	}
}

func TestTarRejectsEscapingNames(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []tarEntry
	}{
		{"parent", []tarEntry{file("../x", "x")}},
		{"deep parent", []tarEntry{file("a/../../x", "x")}},
		{"absolute parent", []tarEntry{file("/../x", "x")}},
		{"dot parent", []tarEntry{file("./../x", "x")}},
		{"parent dir", []tarEntry{dir("a/../../")}},
		{"link target", []tarEntry{file("a", "x"),
			{hdr: tar.Header{Name: "b", Typeflag: tar.TypeLink, Linkname: "../a"}}}},
		{"whiteout parent", []tarEntry{file("../.wh.x", "")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := makeTar(t, tc.entries...)
			for _, layer := range []bool{false, true} {
				st := newStore()
				b := cas.NewBuilder(st, cas.ZeroID)
				_, err := ApplyTar(context.Background(), st, b, bytes.NewReader(data), layer, Options{})
				if !errors.Is(err, cas.ErrInvalidArgument) || !strings.Contains(err.Error(), "escapes the root") {
					t.Errorf("layer=%v: err = %v, want an escape rejected as invalid argument", layer, err)
				}
			}
		})
	}
}

func TestTarMalformed(t *testing.T) {
	good := makeTar(t, file("a", strings.Repeat("a", 3000)), file("b", "b"))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(good)
	zw.Close()
	badSum := bytes.Clone(gz.Bytes())
	badSum[len(badSum)-6] ^= 0xff // in the CRC-32 trailer

	for _, tc := range []struct {
		name string
		data []byte
		want error
	}{
		{"truncated", good[:1200], cas.ErrInvalidArgument},
		{"garbage", bytes.Repeat([]byte("not a tar "), 100), cas.ErrInvalidArgument},
		{"gzip checksum", badSum, cas.ErrInvalidArgument},
		{"truncated gzip", gz.Bytes()[:gz.Len()/2], cas.ErrInvalidArgument},
		{"xz", append([]byte{0xfd, '7', 'z', 'X', 'Z', 0}, make([]byte, 100)...), cas.ErrUnsupported},
		{"root as file", makeTar(t, file(".", "x")), cas.ErrInvalidArgument},
		{"link to nothing", makeTar(t, tarEntry{hdr: tar.Header{Name: "l", Typeflag: tar.TypeLink, Linkname: "nope"}}), cas.ErrInvalidArgument},
		{"link to root", makeTar(t, tarEntry{hdr: tar.Header{Name: "l", Typeflag: tar.TypeLink, Linkname: "./"}}), cas.ErrInvalidArgument},
		{"file under file", makeTar(t, file("f", "x"), file("f/x", "y")), cas.ErrInvalidArgument},
		{"name too long", makeTar(t, file(strings.Repeat("n", 300), "x")), cas.ErrInvalidArgument},
		{"xattr too large", makeTar(t, tarEntry{hdr: tar.Header{Name: "f", Typeflag: tar.TypeReg,
			PAXRecords: map[string]string{"SCHILY.xattr.user.big": strings.Repeat("v", 70<<10)}}}), cas.ErrInvalidArgument},
		{"empty symlink", makeTar(t, tarEntry{hdr: tar.Header{Name: "s", Typeflag: tar.TypeSymlink}}), cas.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			_, err := Tar(context.Background(), newStore(), bytes.NewReader(tc.data), Options{})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}

	t.Run("input error", func(t *testing.T) {
		boom := errors.New("cable unplugged")
		r := io.MultiReader(bytes.NewReader(good[:1024]), iotest.ErrReader(boom))
		_, err := Tar(context.Background(), newStore(), r, Options{})
		if !errors.Is(err, boom) || errors.Is(err, cas.ErrInvalidArgument) {
			t.Fatalf("err = %v, want the input's own error", err)
		}
	})
	t.Run("empty", func(t *testing.T) {
		res, err := Tar(context.Background(), newStore(), bytes.NewReader(nil), Options{})
		if err != nil || res.Files+res.Dirs != 0 || res.Root.IsZero() {
			t.Fatalf("empty input: %+v, %v", res, err)
		}
	})
}

func TestTarStoreFailure(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
	}{{"small member", "small"}, {"large member", strings.Repeat("L", 2<<20)}} {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			entries := []tarEntry{file("first", tc.body)}
			for i := range 50 {
				entries = append(entries, file("more/"+itoa(int64(i)), "content "+itoa(int64(i))))
			}
			data := makeTar(t, entries...)
			boom := errors.New("store full")
			st := newStore()
			st.SetFault(func(op mem.Op, _ cas.ID) error {
				if op == mem.OpPut {
					return boom
				}
				return nil
			})
			_, err := Tar(context.Background(), st, bytes.NewReader(data), Options{Workers: 3})
			if !errors.Is(err, boom) || errors.Is(err, cas.ErrInvalidArgument) {
				t.Fatalf("err = %v, want the store's error", err)
			}
		})
	}
}

func TestTarReimportWritesNoSmallObjects(t *testing.T) {
	var entries []tarEntry
	for i := range 40 {
		entries = append(entries, file("d"+itoa(int64(i%4))+"/f"+itoa(int64(i)), strings.Repeat("z", i*1000)))
	}
	data := makeTar(t, entries...)
	st := newStore()
	first, err := Tar(context.Background(), st, bytes.NewReader(data), Options{})
	must(t, err)
	if int(first.NewObjects) != st.Stats().Created {
		t.Errorf("NewObjects %d, store created %d", first.NewObjects, st.Stats().Created)
	}
	st.ResetStats()
	second, err := Tar(context.Background(), st, bytes.NewReader(data), Options{})
	must(t, err)
	if second.Root != first.Root || second.NewObjects != 0 || st.Stats().Put != 0 {
		t.Fatalf("re-import: root %s vs %s, NewObjects %d, store puts %d",
			second.Root.Short(), first.Root.Short(), second.NewObjects, st.Stats().Put)
	}
}

// TestTarManyObjects crosses the batch bounds, so batches are committed
// mid-import as well as at its end.
func TestTarManyObjects(t *testing.T) {
	const n = batchMaxObjects + 500
	entries := make([]tarEntry, 0, n)
	for i := range n {
		entries = append(entries, file("d"+itoa(int64(i%50))+"/"+itoa(int64(i)), itoa(int64(i))))
	}
	st := newStore()
	res, err := Tar(context.Background(), st, bytes.NewReader(makeTar(t, entries...)), Options{})
	must(t, err)
	if res.Files != n || int(res.NewObjects) != st.Stats().Created || res.NewObjects != n+51 {
		t.Fatalf("Files %d, NewObjects %d, store created %d; want %d files, %d objects",
			res.Files, res.NewObjects, st.Stats().Created, n, n+51)
	}
	es := flatten(t, st, res.Root)
	if got := string(blobOf(t, st, es["d7/4107"].ID)); got != "4107" {
		t.Errorf("d7/4107 = %q", got)
	}
}

func TestApplyTarWhiteouts(t *testing.T) {
	base := makeTar(t,
		file("etc/a", "a"), file("etc/b", "b"),
		file("opq/x", "x"), file("opq/sub/y", "y"),
		file("gone/z", "z"), file("keep", "k"))
	wh := func(name string) tarEntry { return file(name, "") }
	for _, tc := range []struct {
		name  string
		layer []tarEntry
		want  []string
	}{
		{
			name: "whiteouts and opaque",
			layer: []tarEntry{
				wh("etc/.wh.a"),
				wh("opq/.wh..wh..opq"), file("opq/new", "n"),
				wh(".wh.gone"),
				wh("new/.wh.nothing"), // hides what was never there, creates nothing
				wh(".wh..wh.plnk"),    // aufs metadata: ignored
			},
			want: []string{"", "etc", "etc/b", "keep", "opq", "opq/new"},
		},
		{
			// Opaque markers and whiteouts apply to lower layers only, even
			// when they follow this layer's own entries.
			name: "same layer entries survive",
			layer: []tarEntry{
				file("opq/mine", "m"), dir("opq/mydir/"), file("opq/mydir/f", "f"),
				wh("opq/.wh..wh..opq"),
				file("added", "a"), wh(".wh.added"),
			},
			want: []string{"", "added", "etc", "etc/a", "etc/b", "gone", "gone/z", "keep",
				"opq", "opq/mine", "opq/mydir", "opq/mydir/f"},
		},
		{
			name:  "root opaque",
			layer: []tarEntry{file("fresh", "f"), wh(".wh..wh..opq")},
			want:  []string{"", "fresh"},
		},
		{
			name:  "replace dir with file",
			layer: []tarEntry{file("opq", "now a file")},
			want:  []string{"", "etc", "etc/a", "etc/b", "gone", "gone/z", "keep", "opq"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStore()
			ctx := context.Background()
			b := cas.NewBuilder(st, cas.ZeroID)
			_, err := ApplyTar(ctx, st, b, bytes.NewReader(base), true, Options{})
			must(t, err)
			_, err = ApplyTar(ctx, st, b, bytes.NewReader(makeTar(t, tc.layer...)), true, Options{})
			must(t, err)
			id, err := b.Write(ctx, st)
			must(t, err)
			es := flatten(t, st, id)
			if got := keys(es); !slices.Equal(got, tc.want) {
				t.Fatalf("paths %q\nwant  %q", got, tc.want)
			}
			if e, ok := es["opq/mydir"]; ok && (e.Type != cas.TypeDir || e.Mode != 0o755) {
				t.Errorf("restored dir lost its attributes: %+v", e)
			}
		})
	}

	t.Run("not a layer", func(t *testing.T) {
		st := newStore()
		res, err := Tar(context.Background(), st, bytes.NewReader(makeTar(t, file("etc/.wh.a", ""), file("d/.wh..wh..opq", ""))), Options{})
		must(t, err)
		if got := keys(flatten(t, st, res.Root)); !slices.Equal(got, []string{"", "d", "d/.wh..wh..opq", "etc", "etc/.wh.a"}) {
			t.Errorf("plain tar lost its .wh. files: %q", got)
		}
	})
}

// cancelReader cancels after n bytes, mid-stream.
type cancelReader struct {
	r      io.Reader
	n      int64
	cancel func()
}

func (c *cancelReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.n -= int64(n); c.n <= 0 {
		c.cancel()
	}
	return n, err
}

func TestTarCancel(t *testing.T) {
	var entries []tarEntry
	for i := range 400 {
		entries = append(entries, file("f"+itoa(int64(i)), strings.Repeat(string(rune('a'+i%26)), 4096+i)))
	}
	entries = append(entries, file("big", strings.Repeat("B", 3<<20)))
	data := makeTar(t, entries...)
	for _, at := range []int64{100 << 10, int64(len(data)) - 2<<20} {
		t.Run(itoa(at), func(t *testing.T) {
			noLeaks(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var read atomic.Int64
			r := &cancelReader{r: bytes.NewReader(data), n: at, cancel: cancel}
			_, err := Tar(ctx, newStore(), r, Options{Progress: func(n int64) { read.Store(n) }})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			if read.Load() > at+256<<10 {
				t.Errorf("read %d bytes after cancelling at %d", read.Load(), at)
			}
		})
	}
}

func TestTarProgress(t *testing.T) {
	data := makeTar(t, file("a", "aaa"), file("b", strings.Repeat("b", 2<<20)))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(data)
	zw.Close()
	var last int64
	res, err := Tar(context.Background(), newStore(), bytes.NewReader(gz.Bytes()), Options{Progress: func(n int64) {
		if n < last {
			t.Errorf("progress went back from %d to %d", last, n)
		}
		last = n
	}})
	must(t, err)
	if last != int64(gz.Len()) {
		t.Errorf("last progress %d, compressed input %d", last, gz.Len())
	}
	if res.Bytes != 3+2<<20 {
		t.Errorf("Bytes %d", res.Bytes)
	}
}

func TestCleanName(t *testing.T) {
	for in, want := range map[string]string{
		"": "", ".": "", "./": "", "/": "", "//": "",
		"a": "a", "./a/": "a", "/abs/x": "abs/x", "a//b/./c": "a/b/c", "a/../b": "b", "a/b/..": "a",
	} {
		got, err := cleanName(in)
		if err != nil || got != want {
			t.Errorf("cleanName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"..", "../", "/..", "a/../..", "./../a", "a/b/../../../c"} {
		if _, err := cleanName(in); !errors.Is(err, cas.ErrInvalidArgument) {
			t.Errorf("cleanName(%q) err = %v, want invalid argument", in, err)
		}
	}
}
