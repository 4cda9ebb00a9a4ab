package treediff_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/cas/mem"
)

// stores are the stores every tree test runs on.
var stores = []struct {
	name string
	open func(t testing.TB) cas.Store
}{
	{"mem", func(t testing.TB) cas.Store { return mem.New() }},
	{"local", func(t testing.TB) cas.Store {
		s, err := local.Open(t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
}

// countingGetter counts Gets, so tests can prove what a walk did not read.
type countingGetter struct {
	cas.Getter
	n atomic.Int64
}

func (c *countingGetter) Get(ctx context.Context, id cas.ID) (io.ReadCloser, error) {
	c.n.Add(1)
	return c.Getter.Get(ctx, id)
}

// countingStore counts Gets and Puts of a whole store.
type countingStore struct {
	cas.Store
	gets, puts atomic.Int64
}

func (c *countingStore) Get(ctx context.Context, id cas.ID) (io.ReadCloser, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, id)
}

func (c *countingStore) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	c.puts.Add(1)
	return c.Store.Put(ctx, r)
}

// fileE stores content and returns a file entry for it.
func fileE(t testing.TB, st cas.Putter, content string, mode uint32) cas.Entry {
	t.Helper()
	info, _, err := st.Put(context.Background(), strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	return cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: mode}, Size: info.Size, ID: info.ID}
}

func symE(target string) cas.Entry {
	return cas.Entry{Type: cas.TypeSymlink, Attr: cas.Attr{Mode: 0o777}, Target: target}
}

func dirE(mode uint32) cas.Entry {
	return cas.Entry{Type: cas.TypeDir, Attr: cas.Attr{Mode: mode}}
}

// op is one staged change; ops replay on any builder.
type op func(ctx context.Context, b *cas.Builder) error

func put(p string, e cas.Entry) op {
	return func(ctx context.Context, b *cas.Builder) error { return b.Put(ctx, p, e, "") }
}

func link(newPath, oldPath string) op {
	return func(ctx context.Context, b *cas.Builder) error { return b.Link(ctx, newPath, oldPath) }
}

func del(p string) op {
	return func(ctx context.Context, b *cas.Builder) error { return b.Delete(ctx, p) }
}

// build applies ops to a builder on base and writes it.
func build(t testing.TB, st cas.Store, base cas.ID, ops ...op) cas.ID {
	t.Helper()
	ctx := context.Background()
	b := cas.NewBuilder(st, base)
	for i, o := range ops {
		if err := o(ctx, b); err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	return root
}

// node is what a flat view says about one path.
type node struct {
	dir bool
	e   cas.Entry // non-directory: the whole entry; directory: Attr only
}

func (n node) String() string {
	if n.dir {
		return fmt.Sprintf("dir %o %d:%d %d %v", n.e.Mode, n.e.UID, n.e.GID, n.e.MtimeNs, n.e.Xattrs)
	}
	e := n.e
	return fmt.Sprintf("%s %o %d:%d %d %v %s %d %s %d:%d link=%q/%d", e.Type, e.Mode, e.UID, e.GID,
		e.MtimeNs, e.Xattrs, e.ID.Short(), e.Size, e.Target, e.Major, e.Minor, e.LinkGroup, e.Nlink)
}

// flatten maps every path of root ("" for the root) to its node.
func flatten(t testing.TB, g cas.Getter, root cas.ID) map[string]node {
	t.Helper()
	out := map[string]node{}
	if root.IsZero() {
		return out
	}
	var walk func(id cas.ID, p string)
	walk = func(id cas.ID, p string) {
		tr, err := cas.ReadTree(context.Background(), g, id)
		if err != nil {
			t.Fatalf("read tree %q: %v", p, err)
		}
		out[p] = node{dir: true, e: cas.Entry{Attr: tr.Attr}}
		for _, e := range tr.Entries {
			q := joinP(p, e.Name)
			if e.Type == cas.TypeDir {
				walk(e.ID, q)
				continue
			}
			e.Name = ""
			out[q] = node{e: e}
		}
	}
	walk(root, "")
	return out
}

func joinP(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// dfsLess orders paths depth-first by name, the order Diff reports in.
func dfsLess(a, b string) int {
	if a == b {
		return 0
	}
	if a == "" {
		return -1
	}
	if b == "" {
		return 1
	}
	pa, pb := strings.Split(a, "/"), strings.Split(b, "/")
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if c := strings.Compare(pa[i], pb[i]); c != 0 {
			return c
		}
	}
	return len(pa) - len(pb)
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, dfsLess)
	return ks
}

// checkLinks fails unless every hard-link group of root is exact: named
// after its first member in depth-first order, counted right, members
// agreeing on content.
func checkLinks(t testing.TB, g cas.Getter, root cas.ID) {
	t.Helper()
	flat := flatten(t, g, root)
	groups := map[string][]string{}
	for _, p := range sortedKeys(flat) {
		n := flat[p]
		if !n.dir && n.e.LinkGroup != "" {
			groups[n.e.LinkGroup] = append(groups[n.e.LinkGroup], p)
		}
	}
	for name, members := range groups {
		if members[0] != name {
			t.Errorf("group %q: first member is %q", name, members[0])
		}
		for _, m := range members {
			e := flat[m].e
			if int(e.Nlink) != len(members) {
				t.Errorf("group %q: %s has nlink %d, the group has %d members", name, m, e.Nlink, len(members))
			}
			f := flat[members[0]].e
			if e.Type != f.Type || e.ID != f.ID || e.Target != f.Target {
				t.Errorf("group %q: %s differs in content from %s", name, m, members[0])
			}
		}
	}
}

// gen turns fuzz bytes into choices.
type gen struct{ b []byte }

func (g *gen) next() byte {
	if len(g.b) == 0 {
		return 0
	}
	c := g.b[0]
	g.b = g.b[1:]
	return c
}

func (g *gen) done() bool { return len(g.b) == 0 }

var genNames = []string{"a", "b", "c d", "é"}

// path draws a path of one to three names.
func (g *gen) path() string {
	n := int(g.next()%3) + 1
	parts := make([]string, n)
	for i := range parts {
		parts[i] = genNames[int(g.next())%len(genNames)]
	}
	return strings.Join(parts, "/")
}

var genContents = []string{"", "one\n", "two\nlines\n", "bin\x00ary", "no newline"}

// ops draws up to n builder operations; each may fail on the tree it
// meets (a parent that is a file), and is then skipped.
func (g *gen) ops(t testing.TB, st cas.Putter, n int) []op {
	var out []op
	for i := 0; i < n && !g.done(); i++ {
		p := g.path()
		switch g.next() % 8 {
		case 0, 1:
			mode := uint32(0o644)
			if g.next()%2 == 1 {
				mode = 0o755
			}
			e := fileE(t, st, genContents[int(g.next())%len(genContents)], mode)
			e.MtimeNs = int64(g.next() % 2)
			out = append(out, put(p, e))
		case 2:
			out = append(out, put(p, symE([]string{"t1", "../t2"}[g.next()%2])))
		case 3:
			d := dirE([]uint32{0o755, 0o700}[g.next()%2])
			d.UID = uint32(g.next() % 2)
			out = append(out, put(p, d))
		case 4, 5:
			out = append(out, del(p))
		case 6:
			out = append(out, link(p, g.path()))
		case 7:
			e := fileE(t, st, genContents[int(g.next())%len(genContents)], 0o644)
			e.Xattrs = []cas.Xattr{{Name: "user.k", Value: []byte{g.next() % 2}}}
			out = append(out, put(p, e))
		}
	}
	return out
}

// buildLenient applies ops, skipping those the tree refuses.
func buildLenient(t testing.TB, st cas.Store, base cas.ID, ops []op) cas.ID {
	t.Helper()
	ctx := context.Background()
	b := cas.NewBuilder(st, base)
	for _, o := range ops {
		_ = o(ctx, b)
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	return root
}

func equalXattrs(a, b []cas.Xattr) bool {
	return slices.EqualFunc(a, b, func(x, y cas.Xattr) bool { return x.Name == y.Name && bytes.Equal(x.Value, y.Value) })
}
