package treediff

import (
	"testing"

	"github.com/esf-dev/esf/cas"
)

// TestMergeSelfMtimeOnlyFollowsTheHeadsThatMovedIt: when heads only touched
// a path, the heads that left it alone have no say; the result is what
// Merge gives when it takes the path whole from the heads that changed it
// (found by FuzzMerge: base mtime 1, heads 1, 0, 0 gave 1 here and 0 there).
func TestMergeSelfMtimeOnlyFollowsTheHeadsThatMovedIt(t *testing.T) {
	at := func(ns int64) self {
		return self{ok: true, e: cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{MtimeNs: ns}}}
	}
	for _, tc := range []struct {
		name  string
		base  int64
		heads []int64
		want  int64
	}{
		{"moved back by two, one untouched", 1, []int64{1, 0, 0}, 0},
		{"moved back and forward", 5, []int64{3, 7, 5}, 7},
		{"moved back only", 5, []int64{5, 3}, 3},
		{"nobody moved it", 5, []int64{5, 5}, 5},
	} {
		base := at(tc.base)
		heads := make([]self, len(tc.heads))
		for i, ns := range tc.heads {
			heads[i] = at(ns)
		}
		got, conflict := mergeSelf(&base, heads)
		if conflict || got.e.MtimeNs != tc.want {
			t.Errorf("%s: mtime %d (conflict %v), want %d", tc.name, got.e.MtimeNs, conflict, tc.want)
		}
	}
}
