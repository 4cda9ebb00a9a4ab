package export

import (
	"archive/tar"
	"bytes"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"
)

// TestAppendHeaderMatchesArchiveTar: for every header fastHeader accepts,
// appendHeader writes the bytes archive/tar's WriteHeader writes, and
// fastHeader accepts the headers an export of ordinary files writes.
func TestAppendHeaderMatchesArchiveTar(t *testing.T) {
	names := []string{"./", "./a", "./a/", "./dir/sub/", "./dir/f.txt", "./" + strings.Repeat("n", 98),
		"./" + strings.Repeat("n", 99), "./" + strings.Repeat("d/", 49) + "x", "./x/" + strings.Repeat("y", 97) + "/",
		"./caf\u00e9", "./sp ace=eq", "./" + strings.Repeat("z", 200)}
	links := []string{"", "./a", "../up/target", strings.Repeat("l", 100), strings.Repeat("l", 101), "t\u00e9"}
	types := []byte{tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo, tar.TypeChar}
	mtimes := []int64{0, 1, 999_999_999, 1_000_000_000, 1_700_000_000_123_456_789, 1_700_000_000_100_000_000,
		1_700_000_000_000_000_000, 9_999_999_999_999_999_99, (1<<33 - 1) * 1e9, 1 << 33 * 1e9, -1, -1_500_000_000}
	ids := []int{0, 1, 1000, 65534, 1<<21 - 1, 1 << 21}
	sizes := []int64{0, 1, 511, 512, 513, 4096, 1<<33 - 1, 1 << 33}
	r := rand.New(rand.NewSource(1))
	pick := func(n int) int { return r.Intn(n) }
	fast := 0
	for i := range 20000 {
		h := &tar.Header{
			Typeflag: types[pick(len(types))],
			Name:     names[pick(len(names))],
			Mode:     int64(pick(0o10000)),
			Uid:      ids[pick(len(ids))],
			Gid:      ids[pick(len(ids))],
			ModTime:  time.Unix(0, mtimes[pick(len(mtimes))]),
			Format:   tar.FormatPAX,
		}
		switch h.Typeflag {
		case tar.TypeReg:
			h.Size = sizes[pick(len(sizes))]
			h.Name = strings.TrimSuffix(h.Name, "/") + "f"
		case tar.TypeSymlink, tar.TypeLink:
			h.Linkname = links[pick(len(links))]
		case tar.TypeChar:
			h.Devmajor, h.Devminor = 1, 3
		}
		if i%50 == 0 {
			h.PAXRecords = map[string]string{paxXattr + "user.a": "v"}
		}
		if !fastHeader(h) {
			continue
		}
		fast++
		var want bytes.Buffer
		tw := tar.NewWriter(&want)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("%+v: %v", h, err)
		}
		got := appendHeader(nil, h)
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("header %+v:\n got %q\nwant %q", h, got, want.Bytes())
		}
	}
	if fast < 2000 {
		t.Fatalf("only %d of 20000 headers took the fast path", fast)
	}
	for _, typ := range []byte{tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink} {
		h := &tar.Header{Typeflag: typ, Name: fmt.Sprintf("./p000/d%02d/f.txt", typ), Mode: 0o644, Uid: 1000, Gid: 1000,
			ModTime: time.Unix(0, 1_700_000_000_123_456_789), Format: tar.FormatPAX, Size: 100}
		if typ != tar.TypeReg {
			h.Size = 0
		}
		if !fastHeader(h) {
			t.Errorf("an ordinary %c header is not written fast", typ)
		}
	}
}
