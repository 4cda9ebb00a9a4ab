package cas

import (
	"context"
	"fmt"
	"io"
	"slices"
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

// bnode is one directory. Its subdirectories are nodes; its other entries
// live encoded in a leafSet, so a directory of a million files costs about
// its encoded size, not a node with a decoded Entry per name.
type bnode struct {
	attr   Attr // directory attributes, valid once loaded
	base   ID   // tree to load children from; ZeroID: new
	dirs   map[string]*bnode
	leaves leafSet
	// keys holds the link key of each leaf that has one.
	keys   map[string]string
	loaded bool
	dirty  bool
}

func newDir(a Attr) *bnode {
	return &bnode{attr: a, loaded: true, dirty: true, dirs: map[string]*bnode{}}
}

// NewBuilder starts from base, read through g when needed. With a zero base
// the root is an empty directory owned by root with mode 0755.
func NewBuilder(g Getter, base ID) *Builder {
	root := &bnode{base: base}
	if base.IsZero() {
		root = newDir(Attr{Mode: 0o755})
	}
	return &Builder{g: g, root: root}
}

func (b *Builder) load(ctx context.Context, n *bnode) error {
	if n.loaded {
		return nil
	}
	v, err := ReadTreeView(ctx, b.g, n.base)
	if err != nil {
		return err
	}
	n.attr = v.Attr
	n.dirs = make(map[string]*bnode, v.Dirs())
	n.leaves = leafSet{}
	var leaves []uint32
	if v.Len() > v.Dirs() {
		leaves = make([]uint32, 0, v.Len()-v.Dirs())
	}
	for i := range v.Len() {
		if v.Type(i) == TypeDir {
			e := v.Entry(i)
			n.dirs[e.Name] = &bnode{base: e.ID}
			continue
		}
		leaves = append(leaves, v.offs[i])
		if v.Linked(i) {
			e := v.Entry(i)
			n.setKey(e.Name, "\x00base:"+e.LinkGroup)
			b.baseLinks = true
		}
	}
	// The tree's bytes become the leaves' records as they are.
	if len(leaves) > 0 {
		if err := n.leaves.adopt(v.raw, leaves); err != nil {
			return err
		}
	}
	n.loaded = true
	return nil
}

func (n *bnode) setKey(name, key string) {
	if key == "" {
		delete(n.keys, name)
		return
	}
	if n.keys == nil {
		n.keys = map[string]string{}
	}
	n.keys[name] = key
}

// putLeaf stages e (valid, with its name) in n.
func (n *bnode) putLeaf(e *Entry, key string) error {
	if err := n.leaves.put(e); err != nil {
		return err
	}
	n.setKey(e.Name, key)
	return nil
}

// removeLeaf drops the leaf name from n, if there is one.
func (n *bnode) removeLeaf(name string) error {
	n.setKey(name, "")
	return n.leaves.remove(name)
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
		c := n.dirs[name]
		if c == nil {
			if !create {
				return nil, nil
			}
			if e, ok, err := n.leaves.get(name); err != nil {
				return nil, err
			} else if ok {
				return nil, fmt.Errorf("%s is a %s, not a directory: %w",
					strings.Join(parts[:i+1], "/"), e.Type, ErrInvalidArgument)
			}
			c = newDir(mkAttr)
			n.dirs[name] = c
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
	c := dir.dirs[name]
	if e.Type == TypeDir {
		if c != nil {
			if err := b.load(ctx, c); err != nil {
				return err
			}
			c.attr, c.dirty = e.Attr, true
			return nil
		}
		if err := dir.removeLeaf(name); err != nil {
			return err
		}
		dir.dirs[name] = newDir(e.Attr)
		return nil
	}
	if c != nil {
		if err := b.removing(ctx, c); err != nil {
			return err
		}
		delete(dir.dirs, name)
	}
	return dir.putLeaf(&e, linkKey)
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
	name := parts[len(parts)-1]
	if c := dir.dirs[name]; c != nil {
		if err := b.load(ctx, c); err != nil {
			return Entry{}, "", false, err
		}
		return Entry{Name: name, Type: TypeDir, Attr: c.attr}, "", true, nil
	}
	e, ok, err = dir.leaves.get(name)
	if err != nil || !ok {
		return Entry{}, "", false, err
	}
	return e, dir.keys[name], true, nil
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
		dir.setKey(parts[len(parts)-1], key)
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
	c := dir.dirs[name]
	if c != nil {
		if err := b.removing(ctx, c); err != nil {
			return err
		}
	} else if _, ok, err := dir.leaves.get(name); err != nil || !ok {
		return err
	}
	// Mark the path only now that something changes.
	if _, err := b.walkTo(ctx, parts[:len(parts)-1], false, Attr{}, true); err != nil {
		return err
	}
	if c != nil {
		delete(dir.dirs, name)
		return nil
	}
	return dir.removeLeaf(name)
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
	if err != nil || dir == nil || (len(dir.dirs) == 0 && dir.leaves.empty()) {
		return err
	}
	if err := b.removing(ctx, dir); err != nil {
		return err
	}
	if _, err := b.walkTo(ctx, parts, false, Attr{}, true); err != nil {
		return err
	}
	dir.dirs = map[string]*bnode{}
	dir.leaves = leafSet{}
	dir.keys = nil
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
	if err := b.assignLinks(); err != nil {
		return ZeroID, err
	}
	return b.write(ctx, p, b.root)
}

// removing is called before n (or, for Clear, n's children) leaves the
// tree. If the subtree holds members of a base link group, the survivors'
// group name and count change, and Write can only compute them if it loads
// the whole base; whether it does is only known by reading the subtree's
// trees (never its blobs). A removed non-directory needs nothing: its parent
// is loaded, and loading it already noted its group.
func (b *Builder) removing(ctx context.Context, n *bnode) error {
	if b.baseLinks {
		return nil
	}
	return b.loadAll(ctx, n)
}

func (b *Builder) loadAll(ctx context.Context, n *bnode) error {
	if !n.loaded {
		if err := b.load(ctx, n); err != nil {
			return err
		}
	}
	for _, c := range n.dirs {
		if err := b.loadAll(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// assignLinks names each group of loaded entries by its first member in
// depth-first name order, counts the members, and restages (and marks the
// directories above) every member whose group or count changes.
func (b *Builder) assignLinks() error {
	type member struct {
		dir  *bnode
		name string
		path []*bnode // the directories from the root to dir
	}
	type group struct {
		first   string
		members []member
	}
	groups := map[string]*group{}
	var order []*group
	var visit func(n *bnode, prefix string, path []*bnode)
	visit = func(n *bnode, prefix string, path []*bnode) {
		if !n.loaded {
			return
		}
		path = append(path, n)
		names := make([]string, 0, len(n.dirs)+len(n.keys))
		for name := range n.dirs {
			names = append(names, name)
		}
		for name := range n.keys {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			p := name
			if prefix != "" {
				p = prefix + "/" + name
			}
			if c := n.dirs[name]; c != nil {
				visit(c, p, slices.Clip(path))
				continue
			}
			key := n.keys[name]
			g := groups[key]
			if g == nil {
				g = &group{first: p}
				groups[key] = g
				order = append(order, g)
			}
			g.members = append(g.members, member{dir: n, name: name, path: path})
		}
	}
	visit(b.root, "", nil)
	for _, g := range order {
		group, nlink := g.first, uint32(len(g.members))
		if nlink < 2 {
			group, nlink = "", 0
		}
		for _, m := range g.members {
			e, ok, err := m.dir.leaves.get(m.name)
			if err != nil {
				return err
			}
			if !ok || (e.LinkGroup == group && e.Nlink == nlink) {
				continue
			}
			e.LinkGroup, e.Nlink = group, nlink
			if err := m.dir.leaves.put(&e); err != nil {
				return err
			}
			// The entry changed: every directory on its path must be
			// re-encoded.
			for _, d := range m.path {
				d.dirty = true
			}
		}
	}
	return nil
}

func sortedNames(m map[string]*bnode) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// write encodes n entry by entry: its leaves stay encoded until they are
// copied into the tree, so a huge directory is never held decoded.
func (b *Builder) write(ctx context.Context, p Putter, n *bnode) (ID, error) {
	if !n.dirty && !n.base.IsZero() {
		return n.base, nil
	}
	if err := ctx.Err(); err != nil {
		return ZeroID, err
	}
	dirs := sortedNames(n.dirs)
	ids := make([]ID, len(dirs))
	for i, name := range dirs {
		id, err := b.write(ctx, p, n.dirs[name])
		if err != nil {
			return ZeroID, err
		}
		ids[i] = id
	}
	if err := n.leaves.flush(); err != nil {
		return ZeroID, err
	}
	count, size := len(dirs)+n.leaves.len(), n.leaves.size()+len(dirs)*(IDSize+8)
	// encode writes the tree into enc (a fresh encoder of count entries).
	encode := func(enc *TreeEncoder) error {
		i := 0
		err := n.leaves.records(func(name, rec []byte) error {
			for ; i < len(dirs) && dirs[i] < string(name); i++ {
				if err := enc.Add(&Entry{Name: dirs[i], Type: TypeDir, ID: ids[i]}); err != nil {
					return err
				}
			}
			return enc.addRecord(name, rec)
		})
		for ; err == nil && i < len(dirs); i++ {
			err = enc.Add(&Entry{Name: dirs[i], Type: TypeDir, ID: ids[i]})
		}
		return err
	}
	var id ID
	if size <= streamTreeOver {
		enc := NewTreeEncoder(n.attr, count)
		enc.grow(size)
		if err := encode(enc); err != nil {
			return ZeroID, err
		}
		raw, rid, err := enc.Finish()
		if err != nil {
			return ZeroID, err
		}
		if _, _, err := p.Put(ctx, bytesReader(raw)); err != nil {
			return ZeroID, err
		}
		id = rid
	} else {
		var err error
		if id, err = putStreamed(ctx, p, n.attr, count, encode); err != nil {
			return ZeroID, err
		}
	}
	n.base, n.dirty = id, false
	return id, nil
}

// streamTreeOver is the encoded size above which Write streams a tree into
// the store instead of holding it: a directory of a million entries would
// otherwise hold its tree (tens of megabytes) beside its records.
const streamTreeOver = 4 << 20

// putStreamed encodes a tree twice, once to hash it and once into p's Put
// through a pipe, so neither holds more than an encoder's spill buffer.
// The reader tells p the id and size first (IdentifiedReader), so a Putter
// that asks before it writes still can.
func putStreamed(ctx context.Context, p Putter, a Attr, count int, encode func(*TreeEncoder) error) (ID, error) {
	h := NewHasher()
	cw := &countingWriter{w: h}
	enc := NewTreeEncoder(a, count)
	enc.w = cw
	if err := encode(enc); err != nil {
		return ZeroID, err
	}
	if err := enc.finishTo(); err != nil {
		return ZeroID, err
	}
	id := IDFromHash(h)
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		enc := NewTreeEncoder(a, count)
		enc.w = pw
		err := encode(enc)
		if err == nil {
			err = enc.finishTo()
		}
		pw.CloseWithError(err) // nil: EOF
	}()
	info, _, err := p.Put(ctx, &identifiedReader{Reader: pr, id: id, size: cw.n})
	// A Put that stopped early (or never read: stored already) must not
	// leave the encoder blocked on the pipe.
	pr.CloseWithError(io.ErrClosedPipe)
	<-done
	if err != nil {
		return ZeroID, err
	}
	if info.ID != id {
		return ZeroID, fmt.Errorf("tree stored as %s, hashed as %s: %w", info.ID, id, ErrCorrupt)
	}
	return id, nil
}

// IdentifiedReader is a reader whose content id and size are known before
// it is read: a Putter may skip reading it when it has the object.
type IdentifiedReader interface {
	io.Reader
	ContentID() ID
	ContentSize() int64
}

type identifiedReader struct {
	io.Reader
	id   ID
	size int64
}

func (r *identifiedReader) ContentID() ID      { return r.id }
func (r *identifiedReader) ContentSize() int64 { return r.size }

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
