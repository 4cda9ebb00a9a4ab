package cas

import (
	"context"
	"fmt"
	"sort"
	"strings"
)

// Builder stages changes to a tree and writes the result. It starts from a
// base root (ZeroID for an empty tree) and loads base directories only when a
// change reaches into them, so Write re-encodes only the directories on
// changed paths: the cost of a change grows with the change, not with the
// tree. Importers use it with an empty base; seal uses it with the attempt's
// base root.
//
// Hard links: Put takes a link key, an opaque identity of the inode (the
// importer's dev:ino, the tar name of the first member). Entries that share
// a key form one group; Write names every group by its first member in
// depth-first name order and counts its members. Base entries that already
// belong to a group keep their group across Write; if any of them is loaded,
// Write loads the whole base first so the counts stay exact.
//
// A Builder is not safe for concurrent use.
type Builder struct {
	g    Getter
	root *bnode
	// baseLinks is set once a loaded base entry belongs to a link group.
	baseLinks bool
	// links numbers the keys Link invents, so a key is never reused.
	links int
}

type bnode struct {
	entry    Entry // Name, Type and, for non-directories, everything else
	attr     Attr  // directory attributes, valid once loaded
	base     ID    // directory: tree to load children from; ZeroID: new
	children map[string]*bnode
	loaded   bool
	dirty    bool
	linkKey  string
}

// NewBuilder starts from base, read through g when needed. With a zero base
// the root is an empty directory owned by root with mode 0755.
func NewBuilder(g Getter, base ID) *Builder {
	root := &bnode{entry: Entry{Type: TypeDir}, base: base}
	if base.IsZero() {
		root.loaded, root.dirty = true, true
		root.attr = Attr{Mode: 0o755}
		root.children = map[string]*bnode{}
	}
	return &Builder{g: g, root: root}
}

func (b *Builder) load(ctx context.Context, n *bnode) error {
	if n.loaded {
		return nil
	}
	t, err := ReadTree(ctx, b.g, n.base)
	if err != nil {
		return err
	}
	n.attr = t.Attr
	n.children = make(map[string]*bnode, len(t.Entries))
	for _, e := range t.Entries {
		c := &bnode{entry: e}
		if e.Type == TypeDir {
			c.base = e.ID
			c.entry = Entry{Name: e.Name, Type: TypeDir}
		} else if e.LinkGroup != "" {
			c.linkKey = "\x00base:" + e.LinkGroup
			b.baseLinks = true
		}
		n.children[e.Name] = c
	}
	n.loaded = true
	return nil
}

// ReadTree reads and decodes the tree id through g, verifying it first.
func ReadTree(ctx context.Context, g Getter, id ID) (*Tree, error) {
	raw, err := ReadAll(ctx, g, id)
	if err != nil {
		return nil, fmt.Errorf("read tree %s: %w", id, err)
	}
	t, err := DecodeTree(raw)
	if err != nil {
		return nil, fmt.Errorf("tree %s: %w", id, err)
	}
	return t, nil
}

// splitPath validates p ("a/b/c", or "" for the root) and returns its parts.
func splitPath(p string) ([]string, error) {
	p = strings.Trim(p, "/")
	if p == "" {
		return nil, nil
	}
	if err := ValidPath(p); err != nil {
		return nil, err
	}
	return strings.Split(p, "/"), nil
}

// walkTo returns the directory node at parts, creating missing directories
// with the given attributes when create is set, and marks the path dirty
// when mark is set. A missing directory without create returns nil, nil.
func (b *Builder) walkTo(ctx context.Context, parts []string, create bool, mkAttr Attr, mark bool) (*bnode, error) {
	n := b.root
	for i, name := range parts {
		if err := b.load(ctx, n); err != nil {
			return nil, err
		}
		if mark {
			n.dirty = true
		}
		c := n.children[name]
		if c == nil || c.entry.Type != TypeDir {
			if !create {
				return nil, nil
			}
			if c != nil {
				return nil, fmt.Errorf("%s is a %s, not a directory: %w",
					strings.Join(parts[:i+1], "/"), c.entry.Type, ErrInvalidArgument)
			}
			c = &bnode{entry: Entry{Name: name, Type: TypeDir}, attr: mkAttr,
				loaded: true, dirty: true, children: map[string]*bnode{}}
			n.children[name] = c
		}
		n = c
	}
	if err := b.load(ctx, n); err != nil {
		return nil, err
	}
	if mark {
		n.dirty = true
	}
	return n, nil
}

// ImplicitDirAttr is given to directories that Put creates because a deeper
// path needed them (tars often omit directory entries).
var ImplicitDirAttr = Attr{Mode: 0o755}

// Put stages e at path p, replacing whatever was there. Missing parent
// directories are created with ImplicitDirAttr; a parent that exists as a
// non-directory is ErrInvalidArgument. For a directory (e.Type == TypeDir)
// only e.Attr is used: an existing directory keeps its children and takes
// the new attributes, anything else there is replaced by an empty directory.
// The path "" (or "/") sets the root directory's attributes. linkKey groups
// hard links (see Builder); it is ignored for directories.
func (b *Builder) Put(ctx context.Context, p string, e Entry, linkKey string) error {
	parts, err := splitPath(p)
	if err != nil {
		return err
	}
	if e.Type == TypeDir {
		if err := validateAttr(&e.Attr); err != nil {
			return fmt.Errorf("put %s: %w", p, err)
		}
	} else if len(parts) > 0 {
		e.Name = parts[len(parts)-1]
		e.LinkGroup, e.Nlink = "", 0
		if e.Type == TypeSymlink {
			e.Size = int64(len(e.Target))
		}
		if err := validateEntry(&e); err != nil {
			return fmt.Errorf("put %s: %w", p, err)
		}
	}
	if len(parts) == 0 {
		if e.Type != TypeDir {
			return fmt.Errorf("root must be a directory, not a %s: %w", e.Type, ErrInvalidArgument)
		}
		if err := b.load(ctx, b.root); err != nil {
			return err
		}
		b.root.attr, b.root.dirty = e.Attr, true
		return nil
	}
	name := parts[len(parts)-1]
	dir, err := b.walkTo(ctx, parts[:len(parts)-1], true, ImplicitDirAttr, true)
	if err != nil {
		return err
	}
	c := dir.children[name]
	if e.Type == TypeDir {
		if c != nil && c.entry.Type == TypeDir {
			if err := b.load(ctx, c); err != nil {
				return err
			}
			c.attr, c.dirty = e.Attr, true
			return nil
		}
		dir.children[name] = &bnode{entry: Entry{Name: name, Type: TypeDir}, attr: e.Attr,
			loaded: true, dirty: true, children: map[string]*bnode{}}
		return nil
	}
	if c != nil {
		if err := b.removing(ctx, c); err != nil {
			return err
		}
	}
	dir.children[name] = &bnode{entry: e, linkKey: linkKey}
	return nil
}

// Lookup returns the staged entry at p and its link key. For a directory the
// entry carries the directory's attributes (and no id).
func (b *Builder) Lookup(ctx context.Context, p string) (e Entry, linkKey string, ok bool, err error) {
	parts, err := splitPath(p)
	if err != nil {
		return Entry{}, "", false, err
	}
	if len(parts) == 0 {
		if err := b.load(ctx, b.root); err != nil {
			return Entry{}, "", false, err
		}
		return Entry{Type: TypeDir, Attr: b.root.attr}, "", true, nil
	}
	dir, err := b.walkTo(ctx, parts[:len(parts)-1], false, Attr{}, false)
	if err != nil || dir == nil {
		return Entry{}, "", false, err
	}
	c := dir.children[parts[len(parts)-1]]
	if c == nil {
		return Entry{}, "", false, nil
	}
	if c.entry.Type == TypeDir {
		if err := b.load(ctx, c); err != nil {
			return Entry{}, "", false, err
		}
		return Entry{Name: c.entry.Name, Type: TypeDir, Attr: c.attr}, "", true, nil
	}
	return c.entry, c.linkKey, true, nil
}

// Link stages a hard link at newPath to the non-directory at oldPath.
func (b *Builder) Link(ctx context.Context, newPath, oldPath string) error {
	e, key, ok, err := b.Lookup(ctx, oldPath)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("link %s to %s: target not found: %w", newPath, oldPath, ErrInvalidArgument)
	}
	if e.Type == TypeDir {
		return fmt.Errorf("link %s to directory %s: %w", newPath, oldPath, ErrInvalidArgument)
	}
	if key == "" {
		// Give the target an identity so both names join one group.
		b.links++
		key = fmt.Sprintf("\x00link:%d", b.links)
		parts, _ := splitPath(oldPath)
		dir, err := b.walkTo(ctx, parts[:len(parts)-1], false, Attr{}, true)
		if err != nil {
			return err
		}
		dir.children[parts[len(parts)-1]].linkKey = key
	}
	return b.Put(ctx, newPath, e, key)
}

// Delete removes p and everything below it. A missing path is not an error
// (whiteouts may name what a lower layer never had).
func (b *Builder) Delete(ctx context.Context, p string) error {
	parts, err := splitPath(p)
	if err != nil {
		return err
	}
	if len(parts) == 0 {
		return fmt.Errorf("cannot delete the root: %w", ErrInvalidArgument)
	}
	dir, err := b.walkTo(ctx, parts[:len(parts)-1], false, Attr{}, false)
	if err != nil || dir == nil {
		return err
	}
	name := parts[len(parts)-1]
	c, ok := dir.children[name]
	if !ok {
		return nil
	}
	if err := b.removing(ctx, c); err != nil {
		return err
	}
	// Mark the path only now that something changes.
	if _, err := b.walkTo(ctx, parts[:len(parts)-1], false, Attr{}, true); err != nil {
		return err
	}
	delete(dir.children, name)
	return nil
}

// Clear removes every entry below the directory p but keeps p (an opaque
// directory in an overlay layer). A missing or non-directory p is not an
// error.
func (b *Builder) Clear(ctx context.Context, p string) error {
	parts, err := splitPath(p)
	if err != nil {
		return err
	}
	dir, err := b.walkTo(ctx, parts, false, Attr{}, false)
	if err != nil || dir == nil || len(dir.children) == 0 {
		return err
	}
	if err := b.removing(ctx, dir); err != nil {
		return err
	}
	if _, err := b.walkTo(ctx, parts, false, Attr{}, true); err != nil {
		return err
	}
	dir.children = map[string]*bnode{}
	return nil
}

// Write stores every changed tree through p and returns the new root id.
// Unchanged directories keep their ids without being read or written. The
// Builder stays usable: further changes and another Write build on this one.
func (b *Builder) Write(ctx context.Context, p Putter) (ID, error) {
	if b.baseLinks {
		if err := b.loadAll(ctx, b.root); err != nil {
			return ZeroID, err
		}
	}
	b.assignLinks()
	return b.write(ctx, p, b.root)
}

// removing is called before n (or, for Clear, n's children) leaves the
// tree. If the subtree holds members of a base link group, the survivors'
// group name and count change, and Write can only compute them if it loads
// the whole base; whether it does is only known by reading the subtree's
// trees (never its blobs). A removed non-directory needs nothing: its parent
// is loaded, and loading it already noted its group.
func (b *Builder) removing(ctx context.Context, n *bnode) error {
	if b.baseLinks || n.entry.Type != TypeDir {
		return nil
	}
	return b.loadAll(ctx, n)
}

func (b *Builder) loadAll(ctx context.Context, n *bnode) error {
	if n.entry.Type != TypeDir {
		return nil
	}
	if !n.loaded {
		if err := b.load(ctx, n); err != nil {
			return err
		}
	}
	for _, c := range n.children {
		if err := b.loadAll(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// assignLinks names each group of loaded entries by its first member in
// depth-first name order and counts the members.
func (b *Builder) assignLinks() {
	type group struct {
		first string
		nodes []*bnode
	}
	groups := map[string]*group{}
	var order []*group
	var visit func(n *bnode, prefix string)
	visit = func(n *bnode, prefix string) {
		if !n.loaded {
			return
		}
		for _, name := range sortedNames(n.children) {
			c := n.children[name]
			p := name
			if prefix != "" {
				p = prefix + "/" + name
			}
			if c.entry.Type == TypeDir {
				visit(c, p)
				continue
			}
			if c.linkKey == "" {
				continue
			}
			g := groups[c.linkKey]
			if g == nil {
				g = &group{first: p}
				groups[c.linkKey] = g
				order = append(order, g)
			}
			g.nodes = append(g.nodes, c)
		}
	}
	visit(b.root, "")
	for _, g := range order {
		group, nlink := g.first, uint32(len(g.nodes))
		if nlink < 2 {
			group, nlink = "", 0
		}
		for _, c := range g.nodes {
			if c.entry.LinkGroup != group || c.entry.Nlink != nlink {
				c.entry.LinkGroup, c.entry.Nlink = group, nlink
				// The entry changed; its directory must be re-encoded. Marking
				// every loaded directory dirty would cost a full write, so mark
				// precisely: re-walk is cheap because groups are rare.
				b.markContaining(c)
			}
		}
	}
}

// markContaining marks dirty every directory on the path to c.
func (b *Builder) markContaining(target *bnode) {
	var find func(n *bnode) bool
	find = func(n *bnode) bool {
		if !n.loaded {
			return false
		}
		for _, c := range n.children {
			if c == target || (c.entry.Type == TypeDir && find(c)) {
				n.dirty = true
				return true
			}
		}
		return false
	}
	find(b.root)
}

func sortedNames(m map[string]*bnode) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (b *Builder) write(ctx context.Context, p Putter, n *bnode) (ID, error) {
	if !n.dirty && !n.base.IsZero() {
		return n.base, nil
	}
	if err := ctx.Err(); err != nil {
		return ZeroID, err
	}
	t := &Tree{Attr: n.attr, Entries: make([]Entry, 0, len(n.children))}
	for _, name := range sortedNames(n.children) {
		c := n.children[name]
		e := c.entry
		if e.Type == TypeDir {
			id, err := b.write(ctx, p, c)
			if err != nil {
				return ZeroID, err
			}
			e = Entry{Name: name, Type: TypeDir, ID: id}
		}
		t.Entries = append(t.Entries, e)
	}
	raw, id, err := TreeID(t)
	if err != nil {
		return ZeroID, err
	}
	if _, _, err := p.Put(ctx, bytesReader(raw)); err != nil {
		return ZeroID, err
	}
	n.base, n.dirty = id, false
	return id, nil
}
