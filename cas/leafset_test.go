package cas

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"
)

// TestLeafSetAgainstMap replays random puts, removes and lookups on a
// leafSet and on a map, across many flushes, and compares what they hold.
func TestLeafSetAgainstMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var s leafSet
	want := map[string]Entry{}
	for op := range 60000 {
		name := fmt.Sprintf("n%05d", r.IntN(8000))
		switch k := r.IntN(10); {
		case k < 6:
			e := Entry{Name: name, Type: TypeFile, Attr: Attr{Mode: 0o644, MtimeNs: int64(op)},
				Size: int64(op), ID: Sum([]byte(name))}
			if err := s.put(&e); err != nil {
				t.Fatal(err)
			}
			want[name] = e
		case k < 8:
			if err := s.remove(name); err != nil {
				t.Fatal(err)
			}
			delete(want, name)
		default:
			got, ok, err := s.get(name)
			w, wok := want[name]
			if err != nil || ok != wok || (ok && !reflect.DeepEqual(got, w)) {
				t.Fatalf("op %d: get %s = %+v, %v, %v; want %+v, %v", op, name, got, ok, err, w, wok)
			}
		}
	}
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	if s.len() != len(names) {
		t.Fatalf("len = %d, want %d", s.len(), len(names))
	}
	i := 0
	size := 0
	if err := s.records(func(name, rec []byte) error {
		var e Entry
		d := decoder{b: rec}
		d.entry(&e)
		if d.err != nil || len(d.b) != 0 || string(name) != e.Name || !reflect.DeepEqual(e, want[names[i]]) {
			return fmt.Errorf("entry %d = %+v (%v, %d left), want %+v", i, e, d.err, len(d.b), want[names[i]])
		}
		size += len(rec)
		i++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if s.size() != size {
		t.Fatalf("size = %d, records hold %d", s.size(), size)
	}
}

// TestEntryLen checks entryLen against the encoder on every kind of entry.
func TestEntryLen(t *testing.T) {
	for _, tr := range []*Tree{sampleTree(), sparseTree()} {
		for i := range tr.Entries {
			rec := appendEntry(nil, &tr.Entries[i])
			if n := entryLen(append(rec, 1, 2, 3)); n != len(rec) {
				t.Fatalf("entryLen of %q = %d, want %d", tr.Entries[i].Name, n, len(rec))
			}
		}
	}
}

// TestArenaOffsetsSurviveGrowth checks that records keep their offsets
// while slots grow, fill and give way to new ones, and that a record
// larger than half a slot is stored whole.
func TestArenaOffsetsSurviveGrowth(t *testing.T) {
	var a arena
	var offs []uint32
	var recs [][]byte
	for i := range 40000 {
		n := 10 + i%200
		if i%9999 == 0 {
			n = chunkSize/2 + 100 + i
		}
		rec := bytes.Repeat([]byte{byte(i)}, n)
		off, err := a.add(rec)
		if err != nil {
			t.Fatal(err)
		}
		offs, recs = append(offs, off), append(recs, rec)
	}
	for i, off := range offs {
		if got := a.at(off); len(got) < len(recs[i]) || !bytes.Equal(got[:len(recs[i])], recs[i]) {
			t.Fatalf("record %d at %#x differs", i, off)
		}
	}
}
