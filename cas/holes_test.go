package cas

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

// The encoding of a tree without sparse files is the one every existing
// root id was computed from: recording holes must not change a byte of it.
func TestTreeWithoutHolesEncodesAsBefore(t *testing.T) {
	const want = "4553465401ed030000020005016101ed13e807e80709036437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d850206757365722e61013106757365722e62000161020164023ae7d805f6789a6402acb70ad4096a85a56bf6804eaf25c0493ac697548d30b50364657604800300000001030000016606a4030000000000016c03ff03000000062e2e2f6574630000"
	raw, err := EncodeTree(sampleTree())
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(raw); got != want {
		t.Fatalf("encoding changed:\n got %s\nwant %s", got, want)
	}
	// An empty (non-nil) hole list is no holes.
	tr := sampleTree()
	tr.Entries[0].Holes = []Hole{}
	if again, _ := EncodeTree(tr); !bytes.Equal(again, raw) {
		t.Fatal("an empty hole list changed the encoding")
	}
}

func sparseTree() *Tree {
	tr := sampleTree()
	tr.Entries[0].Size = 3 << 20
	tr.Entries[0].Holes = []Hole{{Off: 0, Len: 4096}, {Off: 1 << 20, Len: 1 << 20}, {Off: 3<<20 - 10, Len: 10}}
	return tr
}

func TestTreeHolesRoundTrip(t *testing.T) {
	tr := sparseTree()
	raw, err := EncodeTree(tr)
	if err != nil {
		t.Fatal(err)
	}
	// The sparse entry: type byte 0x81, then after size and id the holes
	// as count, (gap, length)*.
	holes := []byte{3, 0, 0x80, 0x20, 0x80, 0xe0, 0x3f, 0x80, 0x80, 0x40, 0xf6, 0xff, 0x3f, 0x0a}
	if !bytes.Contains(raw, []byte{1, 'a', 0x81}) || !bytes.Contains(raw, holes) {
		t.Fatalf("sparse entry not encoded as documented: %x", raw)
	}
	got, err := DecodeTree(raw)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := got.Lookup("a")
	if e.Type != TypeFile || len(e.Holes) != 3 || e.Holes[1] != (Hole{Off: 1 << 20, Len: 1 << 20}) || e.Holes[2].End() != e.Size {
		t.Fatalf("decoded entry %+v", e)
	}
	if again, _ := EncodeTree(got); !bytes.Equal(again, raw) {
		t.Fatal("re-encode differs")
	}
	plain, _ := EncodeTree(sampleTree())
	if Sum(plain) == Sum(raw) {
		t.Fatal("holes do not change the tree id")
	}
}

func TestTreeRejectsBadHoles(t *testing.T) {
	bad := map[string]func(*Entry){
		"empty hole":        func(e *Entry) { e.Holes[0].Len = 0 },
		"negative offset":   func(e *Entry) { e.Holes[0].Off = -1 },
		"past the size":     func(e *Entry) { e.Holes[2].Len = 11 },
		"adjacent holes":    func(e *Entry) { e.Holes[1].Off = 4096 },
		"overlapping holes": func(e *Entry) { e.Holes[1].Off = 100 },
		"unsorted":          func(e *Entry) { e.Holes[0], e.Holes[1] = e.Holes[1], e.Holes[0] },
		"huge length":       func(e *Entry) { e.Holes[2].Len = 1<<63 - 1 },
	}
	for name, mutate := range bad {
		tr := sparseTree()
		mutate(&tr.Entries[0])
		if _, err := EncodeTree(tr); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: encode err = %v, want invalid argument", name, err)
		}
		if _, err := DecodeTree(appendTree(nil, tr)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: decode err = %v, want corrupt", name, err)
		}
	}
	// Holes belong to files only.
	tr := sampleTree()
	tr.Entries[2].Holes = []Hole{{Off: 0, Len: 1}}
	if _, err := EncodeTree(tr); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("holes on a device: err = %v", err)
	}
	// The sparse type byte with no holes is not canonical.
	one := &Tree{Entries: []Entry{{Name: "f", Type: TypeFile, Size: 10, ID: Sum(make([]byte, 10)), Holes: []Hole{{Off: 0, Len: 10}}}}}
	raw, _ := EncodeTree(one)
	tail := []byte{1, 0, 10, 0, 0} // holes: one (0, 10); no xattrs; no link group
	if !bytes.HasSuffix(raw, tail) {
		t.Fatalf("one-hole tree: %x", raw)
	}
	if _, err := DecodeTree(append(bytes.Clone(raw[:len(raw)-len(tail)]), 0, 0, 0)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("sparse type with zero holes: err = %v, want corrupt", err)
	}
	// Other high-bit types stay unknown.
	mangled := bytes.Clone(raw)
	mangled[bytes.IndexByte(mangled, 0x81)] = 0x82
	if _, err := DecodeTree(mangled); !errors.Is(err, ErrCorrupt) {
		t.Errorf("type 0x82: err = %v, want corrupt", err)
	}
}

func TestSeekHoleData(t *testing.T) {
	// Data [0,10) hole [10,20) data [20,30) hole [30,40), size 40.
	hs := []Hole{{Off: 10, Len: 10}, {Off: 30, Len: 10}}
	const size = 40
	for _, tc := range []struct {
		off        int64
		data, hole int64 // -1: ENXIO
	}{
		{0, 0, 10}, {9, 9, 10}, {10, 20, 10}, {15, 20, 15}, {20, 20, 30},
		{29, 29, 30}, {30, -1, 30}, {39, -1, 39}, {40, -1, -1}, {-1, -1, -1},
	} {
		d, ok := SeekData(hs, size, tc.off)
		if !ok {
			d = -1
		}
		h, ok := SeekHole(hs, size, tc.off)
		if !ok {
			h = -1
		}
		if d != tc.data || h != tc.hole {
			t.Errorf("off %d: SEEK_DATA %d SEEK_HOLE %d, want %d %d", tc.off, d, h, tc.data, tc.hole)
		}
	}
	// No holes: all data, the hole is at the end.
	if h, _ := SeekHole(nil, size, 5); h != size {
		t.Errorf("dense SEEK_HOLE = %d", h)
	}
}

func TestDataBlocks(t *testing.T) {
	for _, tc := range []struct {
		hs   []Hole
		size int64
		want int64
	}{
		{nil, 0, 0},
		{nil, 1, 1},
		{nil, 4096, 1},
		{nil, 4097, 2},
		{[]Hole{{0, 8192}}, 8192, 0},
		{[]Hole{{0, 8192}}, 8193, 1},
		{[]Hole{{4096, 4096}}, 3 * 4096, 2},
		// Unaligned: data in [0,100) and [4000,4100) touches blocks 0 and 1.
		{[]Hole{{100, 3900}}, 4100, 2},
		// Two data runs in one block count it once.
		{[]Hole{{10, 10}}, 30, 1},
		{[]Hole{{0, 100 << 20}}, 100<<20 + 1, 1},
	} {
		if got := DataBlocks(tc.hs, tc.size, 4096); got != tc.want {
			t.Errorf("DataBlocks(%v, %d) = %d, want %d", tc.hs, tc.size, got, tc.want)
		}
	}
}

func TestHoleCheckWriter(t *testing.T) {
	hs := []Hole{{Off: 10, Len: 10}, {Off: 30, Len: 5}}
	for _, tc := range []struct {
		dataAt int
		bad    bool
	}{{-1, false}, {0, false}, {9, false}, {10, true}, {19, true}, {20, false}, {34, true}, {35, false}} {
		b := make([]byte, 40)
		if tc.dataAt >= 0 {
			b[tc.dataAt] = 7
		}
		c := NewHoleCheck(hs)
		for i := 0; i < len(b); i += 3 { // writes straddle hole edges
			c.Write(b[i:min(i+3, len(b))])
		}
		if got := c.Err() != nil; got != tc.bad || (tc.bad && !errors.Is(c.Err(), ErrCorrupt)) {
			t.Errorf("data at %d: err %v, want bad=%v", tc.dataAt, c.Err(), tc.bad)
		}
		if !tc.bad && c.Written() != 40 {
			t.Errorf("written %d", c.Written())
		}
	}
}
