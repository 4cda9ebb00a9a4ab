package journal

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestEncode128(t *testing.T) {
	var zero, ones [16]byte
	for i := range ones {
		ones[i] = 0xff
	}
	one := [16]byte{15: 1}
	tests := []struct {
		in   [16]byte
		want string
	}{
		{zero, strings.Repeat("0", 26)},
		{one, strings.Repeat("0", 25) + "1"},
		{ones, "7" + strings.Repeat("z", 25)},
	}
	for _, tc := range tests {
		if got := encode128(tc.in); got != tc.want {
			t.Errorf("encode128(%x) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// fakeClock returns the times in order, then the last one forever.
func fakeClock(ts ...time.Time) func() time.Time {
	return func() time.Time {
		t := ts[0]
		if len(ts) > 1 {
			ts = ts[1:]
		}
		return t
	}
}

func TestIDGenOrderedAndWellFormed(t *testing.T) {
	base := time.UnixMilli(1_800_000_000_000)
	clock := fakeClock(
		base, base, base, // same millisecond: counts up
		base.Add(-time.Second),  // the clock steps back: still increasing
		base.Add(time.Second),   // forward again
		base.Add(2*time.Second), // and again
	)
	g := NewIDGen(clock, bytes.NewReader(bytes.Repeat([]byte{0xa5, 0x3c, 0xff}, 100)))
	var ids []string
	for range 6 {
		id, err := g.New(KindNode)
		if err != nil {
			t.Fatal(err)
		}
		if len(id) != len("node_")+26 {
			t.Errorf("id %s: want 26 digits after the prefix", id)
		}
		if k, err := KindOf(id); err != nil || k != KindNode {
			t.Errorf("KindOf(%s) = %s, %v", id, k, err)
		}
		ids = append(ids, id)
	}
	if !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != len(ids) {
		t.Errorf("ids not strictly increasing:\n%s", strings.Join(ids, "\n"))
	}
	// The time prefix of a later millisecond sorts after everything earlier.
	if ids[4][:len("node_")+10] <= ids[0][:len("node_")+10] {
		t.Errorf("time prefix did not advance: %s vs %s", ids[4], ids[0])
	}
}

func TestIDGenCrossesRandomOverflow(t *testing.T) {
	base := time.UnixMilli(1_800_000_000_000)
	// The first random part is all ones: the next id in the same
	// millisecond cannot count up and moves to the next millisecond.
	rnd := io.MultiReader(bytes.NewReader(bytes.Repeat([]byte{0xff}, 10)), bytes.NewReader(make([]byte, 10)))
	g := NewIDGen(fakeClock(base), rnd)
	a, err := g.New(KindAttempt)
	if err != nil {
		t.Fatal(err)
	}
	b, err := g.New(KindAttempt)
	if err != nil {
		t.Fatal(err)
	}
	if b <= a {
		t.Errorf("after overflow %s <= %s", b, a)
	}
}

func TestIDGenErrors(t *testing.T) {
	g := NewIDGen(nil, iotest{})
	if _, err := g.New(KindGroup); err == nil {
		t.Error("failing randomness gave an id")
	}
	if _, err := NewID("bogus"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("unknown kind: %v", err)
	}
	// The default generator works for every kind.
	for _, k := range kinds {
		id, err := NewID(k)
		if err != nil || CheckID(k, id) != nil {
			t.Errorf("NewID(%s) = %s, %v", k, id, err)
		}
	}
}

type iotest struct{}

func (iotest) Read([]byte) (int, error) { return 0, errors.New("no entropy") }

func TestCheckID(t *testing.T) {
	tests := []struct {
		kind Kind
		id   string
		ok   bool
	}{
		{KindNode, "node_01hzy3x", true},
		{KindNode, "node_a", true},
		{KindGroup, "grp_" + strings.Repeat("z", 64), true},
		{KindGroup, "grp_" + strings.Repeat("z", 65), false},
		{KindNode, "node_", false},
		{KindNode, "node", false},
		{KindNode, "att_abc", false},
		{KindNode, "node_ABC", false},
		{KindNode, "node_a/b", false},
		{KindNode, "node_a b", false},
		{KindLease, "lease_x1", true},
		{KindEvaluation, "eval_x1", true},
		{KindAttempt, "att_x1", true},
	}
	for _, tc := range tests {
		err := CheckID(tc.kind, tc.id)
		if (err == nil) != tc.ok {
			t.Errorf("CheckID(%s, %q) = %v, want ok=%v", tc.kind, tc.id, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("CheckID(%s, %q): %v is not ErrInvalidArgument", tc.kind, tc.id, err)
		}
	}
	for _, bad := range []string{"", "nodeabc", "foo_abc", "_abc"} {
		if _, err := KindOf(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("KindOf(%q) = %v", bad, err)
		}
	}
}

func TestPrefixEnd(t *testing.T) {
	tests := []struct{ in, want []byte }{
		{[]byte("a/"), []byte("a0")},
		{[]byte{'a', 0xff}, []byte("b")},
		{[]byte{0xff, 0xff}, nil},
		{nil, nil},
	}
	for _, tc := range tests {
		if got := PrefixEnd(tc.in); !bytes.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("PrefixEnd(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
