package cas

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// scanAll is ScanTree of b (stored under its own hash), collected.
func scanAll(b []byte) (Attr, []Entry, error) {
	s := &mapStore{}
	info, _, err := s.Put(context.Background(), bytes.NewReader(b))
	if err != nil {
		return Attr{}, nil, err
	}
	var a Attr
	var es []Entry
	err = ScanTree(context.Background(), s, info.ID,
		func(x *Attr) error { a = *x; return nil },
		func(e *Entry) error { es = append(es, *e); return nil })
	return a, es, err
}

// checkScanMatchesParse fails unless ScanTree accepts exactly what
// ParseTree accepts, with the same attributes and entries.
func checkScanMatchesParse(t *testing.T, b []byte) {
	t.Helper()
	a, es, err := scanAll(b)
	v, perr := ParseTree(b)
	if perr != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("ParseTree: %v; ScanTree: %v, want corrupt", perr, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("ScanTree: %v; ParseTree accepts", err)
	}
	if !reflect.DeepEqual(a, v.Attr) || len(es) != v.Len() {
		t.Fatalf("ScanTree: attr %+v, %d entries; want %+v, %d", a, len(es), v.Attr, v.Len())
	}
	for i := range es {
		if w := v.Entry(i); !reflect.DeepEqual(es[i], w) {
			t.Fatalf("entry %d = %+v, want %+v", i, es[i], w)
		}
	}
}

// TestScanTreeMatchesParse: over trees smaller and larger than the scan
// window, with entries larger than it, and over mangled encodings.
func TestScanTreeMatchesParse(t *testing.T) {
	big := &Tree{Attr: Attr{Mode: 0o755, Xattrs: []Xattr{{Name: "user.dir", Value: bytes.Repeat([]byte("d"), 3000)}}}}
	for i := range 5000 {
		e := Entry{Name: fmt.Sprintf("entry-%07d", i), Type: TypeFile, Attr: Attr{Mode: 0o644}, ID: Sum([]byte{byte(i)})}
		if i%1000 == 7 {
			// Larger than the first window: it must grow.
			v := bytes.Repeat([]byte{byte(i)}, scanWindow*3/4)
			e.Xattrs = []Xattr{{Name: "user.a", Value: v}, {Name: "user.b", Value: v}}
		}
		big.Entries = append(big.Entries, e)
	}
	for _, tr := range []*Tree{sampleTree(), sparseTree(), {}, big} {
		raw, err := EncodeTree(tr)
		if err != nil {
			t.Fatal(err)
		}
		checkScanMatchesParse(t, raw)
		for _, b := range [][]byte{raw[:len(raw)-1], raw[:len(raw)/2], raw[:3], append(bytes.Clone(raw), 0), {}} {
			checkScanMatchesParse(t, b)
		}
		for _, off := range []int{5, len(raw) / 3, len(raw) - 2} {
			if off < 0 || off >= len(raw) {
				continue
			}
			b := bytes.Clone(raw)
			b[off] ^= 0x5a
			checkScanMatchesParse(t, b)
		}
	}
}

// TestScanTreeErrors: a missing tree is not found, a Getter that serves
// other bytes than the id's is corrupt, and fn's error ends the scan.
func TestScanTreeErrors(t *testing.T) {
	ctx := context.Background()
	s := &mapStore{}
	if err := ScanTree(ctx, s, Sum([]byte("none")), nil, func(*Entry) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing tree: %v", err)
	}
	raw, _ := EncodeTree(sampleTree())
	info, _, _ := s.Put(ctx, bytes.NewReader(raw))
	other, _ := EncodeTree(sparseTree())
	s.m[info.ID] = other // served under the wrong id
	if err := ScanTree(ctx, s, info.ID, nil, func(*Entry) error { return nil }); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("wrong bytes: %v", err)
	}
	s.m[info.ID] = raw
	stop := errors.New("stop")
	n := 0
	if err := ScanTree(ctx, s, info.ID, nil, func(*Entry) error { n++; return stop }); err != stop || n != 1 {
		t.Fatalf("fn's error: %v after %d entries", err, n)
	}
}

func FuzzScanTree(f *testing.F) {
	raw, _ := EncodeTree(sampleTree())
	f.Add(raw)
	sparse, _ := EncodeTree(sparseTree())
	f.Add(sparse)
	f.Fuzz(func(t *testing.T, b []byte) { checkScanMatchesParse(t, b) })
}
