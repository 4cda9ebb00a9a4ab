package treediff

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/esf-dev/esf/cas"
)

// ReadWriter is what Merge needs of a store.
type ReadWriter interface {
	cas.Getter
	cas.Putter
}

// ConflictError lists every path on which the heads of a merge disagree.
// It matches ErrConflict with errors.Is.
type ConflictError struct {
	// Paths is sorted and unique; "" is the root directory.
	Paths []string
}

func (e *ConflictError) Error() string {
	shown := make([]string, len(e.Paths))
	for i, p := range e.Paths {
		if p == "" {
			p = "/"
		}
		shown[i] = p
	}
	return fmt.Sprintf("merge: %d conflicting path(s): %s", len(e.Paths), strings.Join(shown, ", "))
}

// Unwrap makes errors.Is(err, ErrConflict) hold.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// Merge merges heads, each a descendant of base, path by path, and returns
// the root of the result. base may be ZeroID (no common ancestor: every path
// counts as added); heads must be real trees. See the package documentation
// for the rules. On a conflict it returns a *ConflictError naming every
// conflicting path and writes nothing. On success it writes only the
// directories where two heads changed different things (and, when several
// heads touched hard-link groups, the directories whose link counts or
// group names change). One head, or heads that all equal base, return
// without reading anything.
func Merge(ctx context.Context, st ReadWriter, base cas.ID, heads []cas.ID) (cas.ID, error) {
	if len(heads) == 0 {
		return cas.ZeroID, fmt.Errorf("merge: no heads: %w", ErrInvalidArgument)
	}
	for _, h := range heads {
		if h.IsZero() {
			return cas.ZeroID, fmt.Errorf("merge: zero head: %w", ErrInvalidArgument)
		}
	}
	m := &merger{ctx: ctx, st: st, trees: map[cas.ID]*cas.Tree{}}
	root := func(id cas.ID) ver {
		if id.IsZero() {
			return ver{}
		}
		return ver{ok: true, e: cas.Entry{Type: cas.TypeDir, ID: id}}
	}
	vs := make([]ver, len(heads))
	for i, h := range heads {
		vs[i] = root(h)
	}
	res, err := m.merge("", "", root(base), vs)
	if err != nil {
		return cas.ZeroID, err
	}
	if len(m.conflicts) > 0 {
		slices.Sort(m.conflicts)
		return cas.ZeroID, &ConflictError{Paths: slices.Compact(m.conflicts)}
	}
	if !res.ok || res.e.Type != cas.TypeDir {
		// The root's own merge always yields a directory when no head
		// conflicts; anything else is a defect worth failing loudly on.
		return cas.ZeroID, fmt.Errorf("merge: result root is not a directory: %w", ErrCorrupt)
	}
	// Children before parents, so no stored tree ever names a missing one.
	for _, raw := range m.pending {
		if _, _, err := st.Put(ctx, strings.NewReader(raw)); err != nil {
			return cas.ZeroID, fmt.Errorf("merge: write tree: %w", err)
		}
	}
	if !m.recursed {
		return res.e.ID, nil
	}
	return relink(ctx, st, base, heads, res.e.ID)
}

// ver is one version of a path: absent, or an entry as stored in its parent
// (a directory is its name, type and tree id).
type ver struct {
	ok bool
	e  cas.Entry
}

func sameVer(a, b *ver) bool {
	if a.ok != b.ok {
		return false
	}
	return !a.ok || EntriesEqual(&a.e, &b.e)
}

// self is what a path is apart from its children: absent, a directory with
// its attributes, or a whole non-directory entry.
type self struct {
	ok  bool
	dir bool
	e   cas.Entry // a non-directory; for a directory only e.Attr is used
}

func sameSelf(a, b *self) bool {
	switch {
	case a.ok != b.ok || a.dir != b.dir:
		return false
	case !a.ok:
		return true
	case a.dir:
		return attrDiff(&a.e.Attr, &b.e.Attr) == 0
	}
	return EntriesEqual(&a.e, &b.e)
}

type merger struct {
	ctx       context.Context
	st        ReadWriter
	trees     map[cas.ID]*cas.Tree
	pending   []string // encoded trees, children first
	conflicts []string
	// recursed is set once two heads changed one path differently, so the
	// result is not simply one head's tree.
	recursed bool
}

func (m *merger) tree(v *ver) (*cas.Tree, error) {
	if !v.ok || v.e.Type != cas.TypeDir {
		return nil, nil
	}
	if t, ok := m.trees[v.e.ID]; ok {
		return t, nil
	}
	if err := m.ctx.Err(); err != nil {
		return nil, err
	}
	t, err := cas.ReadTree(m.ctx, m.st, v.e.ID)
	if err != nil {
		return nil, fmt.Errorf("merge: %w", err)
	}
	m.trees[v.e.ID] = t
	return t, nil
}

// merge returns the merged version of path p (named name) from its version
// in base and in each head. Conflicts are recorded, not returned; once there
// is one, directory results are placeholders (present, zero id) that only
// tell the caller the directory itself survived.
func (m *merger) merge(p, name string, base ver, heads []ver) (ver, error) {
	// Taken whole: nobody changed the path, or every head that did made
	// the same change. A subtree changed by one head is never read.
	var pick *ver
	distinct := false
	for i := range heads {
		if sameVer(&heads[i], &base) {
			continue
		}
		if pick == nil {
			pick = &heads[i]
		} else if !sameVer(pick, &heads[i]) {
			distinct = true
			break
		}
	}
	if pick == nil {
		return base, nil
	}
	if !distinct {
		return *pick, nil
	}
	m.recursed = true

	bt, err := m.tree(&base)
	if err != nil {
		return ver{}, err
	}
	hts := make([]*cas.Tree, len(heads))
	anyDir := bt != nil
	for i := range heads {
		if hts[i], err = m.tree(&heads[i]); err != nil {
			return ver{}, err
		}
		anyDir = anyDir || hts[i] != nil
	}
	bs := selfOf(&base, bt)
	hs := make([]self, len(heads))
	for i := range heads {
		hs[i] = selfOf(&heads[i], hts[i])
	}
	res, conflict := mergeSelf(&bs, hs)
	if conflict {
		m.conflicts = append(m.conflicts, p)
	}
	if !anyDir {
		if conflict || !res.ok {
			return ver{}, nil
		}
		return ver{ok: true, e: res.e}, nil
	}

	// A head whose version is not a directory has no entries here: for the
	// merge, it deleted every one of them.
	var entries []cas.Entry
	var present []string
	childHeads := make([]ver, len(heads))
	for _, n := range childNames(bt, hts) {
		cb := child(bt, n)
		for i := range heads {
			childHeads[i] = child(hts[i], n)
		}
		r, err := m.merge(join(p, n), n, cb, childHeads)
		if err != nil {
			return ver{}, err
		}
		if r.ok {
			entries = append(entries, r.e)
			present = append(present, n)
		}
	}
	switch {
	case conflict:
		return ver{}, nil
	case !res.dir:
		// The directory is gone (or became a file) by one head's change
		// while another head changed or added something below it.
		for _, n := range present {
			m.conflicts = append(m.conflicts, join(p, n))
		}
		if !res.ok {
			return ver{}, nil
		}
		return ver{ok: true, e: res.e}, nil
	case len(m.conflicts) > 0:
		return ver{ok: true, e: cas.Entry{Name: name, Type: cas.TypeDir}}, nil
	}
	raw, id, err := cas.TreeID(&cas.Tree{Attr: res.e.Attr, Entries: entries})
	if err != nil {
		return ver{}, fmt.Errorf("merge %s: %w", p, err)
	}
	m.pending = append(m.pending, string(raw))
	return ver{ok: true, e: cas.Entry{Name: name, Type: cas.TypeDir, ID: id}}, nil
}

func selfOf(v *ver, t *cas.Tree) self {
	switch {
	case !v.ok:
		return self{}
	case t != nil:
		return self{ok: true, dir: true, e: cas.Entry{Attr: t.Attr}}
	}
	return self{ok: true, e: v.e}
}

// mergeSelf is the three-way merge of one path's own value. A change of
// mtime alone is not a change of content: two heads that made the same
// change at different times (the same file written by two agents, a
// directory both added entries to) agree, and the later mtime wins, so the
// result does not depend on the order of the heads. A head that only
// touched a path yields to one that changed it; when heads only touched it,
// the latest mtime among those that moved it wins, earlier than base's or
// not, as a path taken whole (every head that changed it agrees) would.
func mergeSelf(base *self, heads []self) (self, bool) {
	var pick *self
	for i := range heads {
		if sameSelfExceptMtime(&heads[i], base) {
			continue
		}
		switch {
		case pick == nil:
			pick = &heads[i]
		case !sameSelfExceptMtime(pick, &heads[i]):
			return self{}, true
		case heads[i].e.MtimeNs > pick.e.MtimeNs:
			pick = &heads[i]
		}
	}
	if pick != nil {
		return *pick, false
	}
	// Nobody changed more than mtimes: keep base, at the latest mtime of
	// the heads that changed it (a head that left the path alone has no
	// say, as when the path is taken whole from the heads that changed it).
	out := *base
	moved := false
	for i := range heads {
		if !heads[i].ok || heads[i].e.MtimeNs == base.e.MtimeNs {
			continue
		}
		if !moved || heads[i].e.MtimeNs > out.e.MtimeNs {
			out.e.MtimeNs = heads[i].e.MtimeNs
			moved = true
		}
	}
	return out, false
}

func sameSelfExceptMtime(a, b *self) bool {
	x, y := *a, *b
	x.e.MtimeNs, y.e.MtimeNs = 0, 0
	return sameSelf(&x, &y)
}

func childNames(bt *cas.Tree, hts []*cas.Tree) []string {
	var names []string
	add := func(t *cas.Tree) {
		if t == nil {
			return
		}
		for i := range t.Entries {
			names = append(names, t.Entries[i].Name)
		}
	}
	add(bt)
	for _, t := range hts {
		add(t)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func child(t *cas.Tree, name string) ver {
	if t == nil {
		return ver{}
	}
	e, ok := t.Lookup(name)
	if !ok {
		return ver{}
	}
	return ver{ok: true, e: *e}
}

// errStop ends a scan early.
var errStop = errors.New("stop")

// relink makes the hard-link groups of merged, which combines the changes
// of several heads, exact again. Every head's own groups are exact, and a
// head whose changes hold no link-group member (on either side) leaves every
// group as base had it, so with at most one such head merged is exact as it
// stands. Otherwise group names and counts may be stale (two heads each
// linked a new name to one file, say), and the Builder recomputes them: it
// treats entries that share a LinkGroup as one group, names it after its
// first member in depth-first order and counts its members. The trees it
// replaces stay in the store unreferenced (GC removes them).
func relink(ctx context.Context, st ReadWriter, base cas.ID, heads []cas.ID, merged cas.ID) (cas.ID, error) {
	touching, member := 0, ""
	for _, h := range heads {
		if h == base {
			continue
		}
		touches := false
		err := DiffWith(ctx, st, base, h, Options{Expand: true}, func(c Change) error {
			if c.Old != nil && c.Old.LinkGroup != "" {
				touches = true
			}
			if c.New != nil && c.New.LinkGroup != "" {
				touches = true
				if member == "" {
					// Conflict-free, so merged holds this head's
					// version here: a member.
					member = c.Path
				}
			}
			if touches && member != "" {
				return errStop
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStop) {
			return cas.ZeroID, fmt.Errorf("merge: link groups: %w", err)
		}
		if touches {
			touching++
		}
	}
	if touching < 2 || member == "" {
		return merged, nil
	}
	b := cas.NewBuilder(st, merged)
	// Loading one member tells the Builder the base has groups, so Write
	// loads everything and recounts.
	if _, _, _, err := b.Lookup(ctx, member); err != nil {
		return cas.ZeroID, fmt.Errorf("merge: link groups: %w", err)
	}
	id, err := b.Write(ctx, st)
	if err != nil {
		return cas.ZeroID, fmt.Errorf("merge: link groups: %w", err)
	}
	return id, nil
}
