package treediff_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/treediff"
)

var fuzzSeeds = [][]byte{
	{},
	{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20},
	[]byte("\x02\x00\x01\x00\x01\x00\x05\x00\x06\x02\x01\x03\x00\x02\x04\x00\x01"),
	[]byte("merge me: some random bytes that pick paths and ops \x00\x01\x02\x03\xff\xfe"),
	[]byte("\x03\x01\x06\x00\x00\x02\x00\x06\x01\x00\x02\x01\x00\x00\x00\x03\x01\x02\x05\x00\x04"),
	[]byte("links \x06\x06\x06\x00\x01\x02\x06\x06\x06\x03\x02\x01"),
}

// changeKind is what the flat model says changed between two nodes.
func changeKind(a, b node, okA, okB bool) (treediff.Kind, bool) {
	switch {
	case !okA && !okB:
		return 0, false
	case !okA:
		return treediff.Added, true
	case !okB:
		return treediff.Deleted, true
	case a.dir != b.dir || (!a.dir && a.e.Type != b.e.Type):
		return treediff.TypeChanged, true
	case a.String() == b.String():
		return 0, false
	case a.dir:
		return treediff.MetaChanged, true
	case a.e.ID != b.e.ID || a.e.Size != b.e.Size || a.e.Target != b.e.Target || a.e.Major != b.e.Major || a.e.Minor != b.e.Minor:
		return treediff.Modified, true
	}
	return treediff.MetaChanged, true
}

// FuzzDiffApply checks Diff against a flat model of both trees, its order,
// and that applying it to the old tree yields the new one.
func FuzzDiffApply(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st := mem.New()
		ctx := context.Background()
		g := &gen{b: data}
		a := buildLenient(t, st, cas.ZeroID, g.ops(t, st, 12))
		b := buildLenient(t, st, a, g.ops(t, st, 8))

		// The model: every path whose node differs, in depth-first order.
		fa, fb := flatten(t, st, a), flatten(t, st, b)
		union := map[string]bool{}
		for p := range fa {
			union[p] = true
		}
		for p := range fb {
			union[p] = true
		}
		var want []string
		for _, p := range sortedKeys(union) {
			na, okA := fa[p]
			nb, okB := fb[p]
			if k, ok := changeKind(na, nb, okA, okB); ok {
				s := k.String() + " " + p
				if m := modelMeta(na, nb); (k == treediff.Modified || k == treediff.MetaChanged) && m != "" {
					s += " [" + m + "]"
				}
				want = append(want, s)
			}
		}
		got, cs := collect(t, st, a, b, treediff.Options{Expand: true})
		if !slices.Equal(got, want) {
			t.Fatalf("diff:\n%q\nmodel:\n%q", got, want)
		}
		for i := 1; i < len(cs); i++ {
			if dfsLess(cs[i-1].Path, cs[i].Path) >= 0 {
				t.Fatalf("order: %q before %q", cs[i-1].Path, cs[i].Path)
			}
		}

		bl := cas.NewBuilder(st, a)
		for _, c := range cs {
			if err := treediff.Apply(ctx, bl, c); err != nil {
				t.Fatalf("apply %v %q: %v", c.Kind, c.Path, err)
			}
		}
		root, err := bl.Write(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		if root != b {
			t.Fatalf("applied diff gives %s, want %s:\n%q", root.Short(), b.Short(), flatDiff(t, st, b, root))
		}
	})
}

// FuzzMerge checks Merge against a flat, path-by-path model of the rules:
// every path merged three-way on its own value (an mtime alone is not a
// change: heads that agree but for it take the latest, and a head that only
// touched a path yields), then every surviving path whose parent did not
// survive as a directory is a conflict.
func FuzzMerge(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st := mem.New()
		ctx := context.Background()
		g := &gen{b: data}
		nheads := 2 + int(g.next()%2)
		// Each tree draws from its own share of the input, so heads are
		// not starved by a long base.
		parts := splitN(g.b, nheads+1)
		base := buildLenient(t, st, cas.ZeroID, (&gen{b: parts[0]}).ops(t, st, 10))
		heads := make([]cas.ID, nheads)
		for i := range heads {
			heads[i] = buildLenient(t, st, base, (&gen{b: parts[i+1]}).ops(t, st, 5))
		}

		fbase := flatten(t, st, base)
		fheads := make([]map[string]node, nheads)
		union := map[string]bool{}
		for p := range fbase {
			union[p] = true
		}
		for i, h := range heads {
			fheads[i] = flatten(t, st, h)
			for p := range fheads[i] {
				union[p] = true
			}
		}
		type res struct {
			n  node
			ok bool
		}
		result := map[string]res{}
		conflicted := map[string]bool{}
		// key is a path's value but for its mtime.
		key := func(m map[string]node, p string) (string, node, bool) {
			n, ok := m[p]
			if !ok {
				return "-", n, false
			}
			k := n
			k.e.MtimeNs = 0
			return k.String(), n, true
		}
		for p := range union {
			bk, bn, bok := key(fbase, p)
			var pick *res
			conflict := false
			pickKey := ""
			for i := range heads {
				hk, hn, hok := key(fheads[i], p)
				if hk == bk {
					continue
				}
				switch {
				case pick == nil:
					pick, pickKey = &res{hn, hok}, hk
				case hk != pickKey:
					conflict = true
				case hn.e.MtimeNs > pick.n.e.MtimeNs:
					pick.n = hn
				}
			}
			switch {
			case conflict:
				conflicted[p] = true
			case pick != nil:
				result[p] = *pick
			default:
				// Nobody changed more than mtimes: base at the latest
				// mtime of the heads that moved it.
				moved := false
				for i := range heads {
					hn, ok := fheads[i][p]
					if !ok || hn.e.MtimeNs == fbase[p].e.MtimeNs {
						continue
					}
					if !moved || hn.e.MtimeNs > bn.e.MtimeNs {
						bn.e.MtimeNs, moved = hn.e.MtimeNs, true
					}
				}
				result[p] = res{bn, bok}
			}
		}
		var wantConflicts []string
		for p := range union {
			if conflicted[p] || p == "" || !result[p].ok {
				continue
			}
			parent := ""
			if i := lastSlash(p); i >= 0 {
				parent = p[:i]
			}
			if conflicted[parent] {
				continue
			}
			if r := result[parent]; !r.ok || !r.n.dir {
				wantConflicts = append(wantConflicts, p)
			}
		}
		for p := range conflicted {
			wantConflicts = append(wantConflicts, p)
		}
		slices.Sort(wantConflicts)

		got, err := treediff.Merge(ctx, st, base, heads)
		if len(wantConflicts) > 0 {
			var ce *treediff.ConflictError
			if !errors.As(err, &ce) {
				t.Fatalf("merge: %v (%s), model conflicts %q", err, got.Short(), wantConflicts)
			}
			if !slices.Equal(ce.Paths, wantConflicts) {
				t.Fatalf("conflicts %q, model %q", ce.Paths, wantConflicts)
			}
			return
		}
		if err != nil {
			t.Fatalf("merge: %v", err)
		}
		fgot := flatten(t, st, got)
		strip := func(n node) string {
			n.e.LinkGroup, n.e.Nlink = "", 0
			return n.String()
		}
		for p, r := range result {
			n, ok := fgot[p]
			if ok != r.ok || (ok && strip(n) != strip(r.n)) {
				t.Fatalf("path %q: merged %v %s, model %v %s", p, ok, n, r.ok, r.n)
			}
		}
		for p := range fgot {
			if _, ok := result[p]; !ok {
				t.Fatalf("merged tree has %q, the model does not know it", p)
			}
		}
		checkLinks(t, st, got)
	})
}

// modelMeta names the attributes that differ, as Meta.String does.
func modelMeta(a, b node) string {
	var parts []string
	if a.e.Mode != b.e.Mode {
		parts = append(parts, "mode")
	}
	if a.e.UID != b.e.UID || a.e.GID != b.e.GID {
		parts = append(parts, "owner")
	}
	if a.e.MtimeNs != b.e.MtimeNs {
		parts = append(parts, "mtime")
	}
	if !equalXattrs(a.e.Xattrs, b.e.Xattrs) {
		parts = append(parts, "xattrs")
	}
	if a.e.LinkGroup != b.e.LinkGroup || a.e.Nlink != b.e.Nlink {
		parts = append(parts, "link")
	}
	return strings.Join(parts, ",")
}

// splitN cuts b into n nearly equal parts.
func splitN(b []byte, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		lo, hi := len(b)*i/n, len(b)*(i+1)/n
		out[i] = b[lo:hi]
	}
	return out
}

func lastSlash(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '/' {
			return i
		}
	}
	return -1
}
