// Package fake is a mounter.Mounter of plain directories, for fabric's
// logic tests: it needs no root, FUSE or overlayfs. It passes the
// conformance suite (mounter/mountertest).
//
//   - The projection is a directory: roots/<id> is exported from the store
//     (export.ToDir) the first time a delta, a view or RootAttr needs it.
//   - A delta's writable root is an export of its root into l.Root, with a
//     manifest (in l.Dir) of what the export made: each path's inode and
//     change time. Unmount moves the root's entries into l.Dir/merged,
//     Mount moves them back: what the attempt wrote stays, as with an
//     overlay's upper directory.
//   - Seal compares the root with the manifest: a path gone is a deletion
//     (overlay's whiteout), a path whose inode changed replaces the base's
//     (an opaque directory), a changed or new one is staged with its
//     parents into a directory shaped like an upper directory, which
//     ingest.Upper imports over the base with the deletions applied.
//   - A view is an export of the root into the directory.
//
// What it does not do: make anything read-only (views and projected roots
// can be written; tests must not rely on EROFS), notice that a root is busy
// (Unmount never fails with ErrFailedPrecondition), keep a copy-on-write
// snapshot (an attempt's write to a file changes only its root), keep
// xattrs of changed files, or survive the process (a new Mounter knows no
// mount; Mounted asks only this one).
package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/export"
	"github.com/esf-dev/esf/fusefs"
	"github.com/esf-dev/esf/ingest"
	"github.com/esf-dev/esf/internal/rootfs"
	"github.com/esf-dev/esf/mounter"
)

// Mounter is the fake mounter; the zero value is not usable, call New.
type Mounter struct {
	mu sync.Mutex
	// projections maps a served projection's directory to its store.
	projections map[string]cas.Getter
	// deltas maps a mounted writable root to its layout.
	deltas map[string]delta.Layout
	// views maps a view's directory to the root it shows.
	views map[string]cas.ID
}

var _ mounter.Mounter = (*Mounter)(nil)

// New returns a fake mounter with nothing mounted.
func New() *Mounter {
	return &Mounter{projections: map[string]cas.Getter{}, deltas: map[string]delta.Layout{}, views: map[string]cas.ID{}}
}

type server struct {
	m   *Mounter
	mnt string
}

// Unmount forgets the projection and deletes the roots it exported.
func (s server) Unmount() error {
	s.m.mu.Lock()
	delete(s.m.projections, s.mnt)
	s.m.mu.Unlock()
	return os.RemoveAll(filepath.Join(s.mnt, "roots"))
}

// ServeProjection remembers opts.Store as the content of mnt/roots.
func (m *Mounter) ServeProjection(mnt string, opts fusefs.Options) (mounter.Server, error) {
	if opts.Store == nil {
		return nil, fmt.Errorf("fake projection: no store: %w", cas.ErrInvalidArgument)
	}
	if err := os.MkdirAll(filepath.Join(mnt, "roots"), 0o700); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.projections[filepath.Clean(mnt)] = opts.Store
	return server{m: m, mnt: filepath.Clean(mnt)}, nil
}

// projected returns the store and root id of a projected root's path.
func (m *Mounter) projected(dir string) (cas.Getter, cas.ID, error) {
	dir = filepath.Clean(dir)
	rootsDir, hex := filepath.Split(dir)
	mnt := filepath.Dir(filepath.Clean(rootsDir))
	if filepath.Base(filepath.Clean(rootsDir)) != "roots" {
		return nil, cas.ZeroID, fmt.Errorf("fake projection: %s is not a projected root: %w", dir, cas.ErrInvalidArgument)
	}
	id, err := cas.ParseID(hex)
	if err != nil {
		return nil, cas.ZeroID, fmt.Errorf("fake projection: %s: %w", dir, err)
	}
	m.mu.Lock()
	g := m.projections[mnt]
	m.mu.Unlock()
	if g == nil {
		return nil, cas.ZeroID, fmt.Errorf("fake projection: nothing served at %s: %w", mnt, unix.ENOTCONN)
	}
	return g, id, nil
}

// materialise exports the projected root dir if it is not there yet.
func (m *Mounter) materialise(dir string) error {
	g, id, err := m.projected(dir)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(dir); err == nil {
		return nil
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".export-")
	if err != nil {
		return err
	}
	if _, err := export.ToDir(context.Background(), g, id, tmp, export.Options{}); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, serr := os.Lstat(dir); serr == nil {
			return nil // exported by someone else meanwhile
		}
		return err
	}
	return nil
}

// RootAttr reads the attributes of a projected root, exporting it first.
func (m *Mounter) RootAttr(dir string) (delta.RootAttr, error) {
	if err := m.materialise(dir); err != nil {
		return delta.RootAttr{}, err
	}
	return delta.ReadRootAttr(dir)
}

// manifest records what an export made: path (relative, "." the root) to
// inode and change time.
type manifest map[string]stamp

type stamp struct {
	Ino   uint64 `json:"ino"`
	Ctime int64  `json:"ctime"`
}

func stampOf(st *unix.Stat_t) stamp {
	return stamp{Ino: st.Ino, Ctime: st.Ctim.Sec*1e9 + st.Ctim.Nsec}
}

func manifestPath(l delta.Layout) string { return filepath.Join(l.Dir, "manifest.json") }
func mergedPath(l delta.Layout) string   { return filepath.Join(l.Dir, "merged") }

func readManifest(l delta.Layout) (manifest, error) {
	b, err := os.ReadFile(manifestPath(l))
	if err != nil {
		return nil, err
	}
	var mf manifest
	if err := json.Unmarshal(b, &mf); err != nil {
		return nil, fmt.Errorf("fake delta %s: manifest: %w", l.Dir, cas.ErrCorrupt)
	}
	return mf, nil
}

func writeManifest(l delta.Layout, mf manifest) error {
	b, err := json.Marshal(mf)
	if err != nil {
		return err
	}
	tmp := manifestPath(l) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, manifestPath(l))
}

// scan records every path below dir.
func scan(dir string) (manifest, error) {
	mf := manifest{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		mf[rel] = stampOf(&st)
		return nil
	})
	return mf, err
}

// Mount makes l.Root the attempt's writable root: an export of the lower
// root the first time, what the last Unmount kept after that.
func (m *Mounter) Mount(l delta.Layout) error {
	m.mu.Lock()
	_, busy := m.deltas[l.Root]
	m.mu.Unlock()
	if busy {
		return fmt.Errorf("fake mount at %s: %w", l.Root, unix.EBUSY)
	}
	for _, d := range []string{l.Dir, l.Upper(), l.Root} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if ents, err := os.ReadDir(l.Root); err != nil || len(ents) > 0 {
		return fmt.Errorf("fake mount at %s: not an empty directory (%v): %w", l.Root, err, cas.ErrFailedPrecondition)
	}
	if _, err := os.Lstat(mergedPath(l)); err == nil {
		if err := moveEntries(l, mergedPath(l), l.Root); err != nil {
			return err
		}
	} else {
		g, id, err := m.projected(l.Lower)
		if err != nil {
			return err
		}
		if _, err := export.ToDir(context.Background(), g, id, l.Root, export.Options{}); err != nil {
			return fmt.Errorf("fake mount at %s: %w", l.Root, err)
		}
		mf, err := scan(l.Root)
		if err != nil {
			return err
		}
		if err := writeManifest(l, mf); err != nil {
			return err
		}
	}
	m.mu.Lock()
	m.deltas[l.Root] = l
	m.mu.Unlock()
	return nil
}

// moveEntries moves the entries of from into to, and from's attributes
// to to, then removes from if it is the delta's merged directory. The
// rename changes an entry's change time: entries unchanged before the
// move stay unchanged in the manifest.
func moveEntries(l delta.Layout, from, to string) error {
	mf, err := readManifest(l)
	if err != nil {
		return err
	}
	attr, err := delta.ReadRootAttr(from)
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, e := range ents {
		var before, after unix.Stat_t
		src, dst := filepath.Join(from, e.Name()), filepath.Join(to, e.Name())
		if err := unix.Lstat(src, &before); err != nil {
			return err
		}
		if err := os.Rename(src, dst); err != nil {
			return err
		}
		if err := unix.Lstat(dst, &after); err != nil {
			return err
		}
		if s, ok := mf[e.Name()]; ok && s == stampOf(&before) {
			mf[e.Name()] = stampOf(&after)
		}
	}
	if err := applyAttr(to, &attr); err != nil {
		return err
	}
	if from == mergedPath(l) {
		if err := os.Remove(from); err != nil {
			return err
		}
	}
	return writeManifest(l, mf)
}

// applyAttr gives dir the owner (if it may), mode and times of attr.
func applyAttr(dir string, a *delta.RootAttr) error {
	os.Lchown(dir, int(a.UID), int(a.GID)) // only root may; the fake does without
	// Chmod takes the permission and set-id and sticky bits, not the type.
	if err := os.Chmod(dir, rootfs.FileMode(a.Mode)); err != nil {
		return err
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, dir, []unix.Timespec{a.Atim, a.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
}

// Reclaim does nothing: a fake delta has no volatile marker.
func (m *Mounter) Reclaim(delta.Layout) error { return nil }

// Unmount moves a writable root's entries into its delta, or empties a
// view. Nothing mounted at dir is fine.
func (m *Mounter) Unmount(dir string) error {
	dir = filepath.Clean(dir)
	m.mu.Lock()
	l, isDelta := m.deltas[dir]
	_, isView := m.views[dir]
	m.mu.Unlock()
	switch {
	case isDelta:
		if err := os.Mkdir(mergedPath(l), 0o700); err != nil {
			return err
		}
		if err := moveEntries(l, l.Root, mergedPath(l)); err != nil {
			return err
		}
		// A mountpoint shows its own (empty, 0700) directory again.
		if err := os.Chmod(l.Root, 0o700); err != nil {
			return err
		}
		m.mu.Lock()
		delete(m.deltas, dir)
		m.mu.Unlock()
	case isView:
		if err := emptyDir(dir); err != nil {
			return err
		}
		m.mu.Lock()
		delete(m.views, dir)
		m.mu.Unlock()
	}
	return nil
}

// emptyDir removes everything below dir, which stays.
func emptyDir(dir string) error {
	// An export's directories may be read-only to their owner.
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return os.Chmod(dir, 0o700)
}

// Detach is Unmount: nothing is ever busy here.
func (m *Mounter) Detach(dir string) error { return m.Unmount(dir) }

// Mounted reports whether this Mounter mounted a root or a view at dir.
func (m *Mounter) Mounted(dir string) bool {
	dir = filepath.Clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	_, d := m.deltas[dir]
	_, v := m.views[dir]
	return d || v
}

// UpperInUse reports whether a root is mounted over the delta dir.
func (m *Mounter) UpperInUse(dir string) bool {
	dir = filepath.Clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.deltas {
		if filepath.Clean(l.Dir) == dir {
			return true
		}
	}
	return false
}

// BindView exports the projected root src into dir.
func (m *Mounter) BindView(src, dir string) error {
	_, id, err := m.projected(src)
	if err != nil {
		return err
	}
	if err := m.materialise(src); err != nil {
		return err
	}
	g, _, _ := m.projected(src)
	if _, err := export.ToDir(context.Background(), g, id, dir, export.Options{}); err != nil {
		return fmt.Errorf("fake view %s: %w", dir, err)
	}
	m.mu.Lock()
	m.views[filepath.Clean(dir)] = id
	m.mu.Unlock()
	return nil
}

// IsView reports whether dir is a view this Mounter made.
func (m *Mounter) IsView(dir string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.views[filepath.Clean(dir)]
	return ok
}

// Views lists the views of the projection at mnt (every view: a fake view
// is not tied to one projection).
func (m *Mounter) Views(mnt string) ([]mounter.View, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []mounter.View
	for dir, id := range m.views {
		out = append(out, mounter.View{Dir: dir, RootID: id})
	}
	slices.SortFunc(out, func(a, b mounter.View) int { return strings.Compare(a.Dir, b.Dir) })
	return out, nil
}

// Seal stores what the delta holds over base: see the package doc.
func (m *Mounter) Seal(ctx context.Context, st ingest.Store, base cas.ID, l delta.Layout, opts ingest.Options) (ingest.Result, error) {
	mf, err := readManifest(l)
	if err != nil {
		return ingest.Result{}, fmt.Errorf("fake seal %s: %w", l.Dir, err)
	}
	m.mu.Lock()
	ml, mounted := m.deltas[filepath.Clean(l.Root)]
	if !mounted {
		for _, d := range m.deltas {
			if filepath.Clean(d.Dir) == filepath.Clean(l.Dir) {
				ml, mounted = d, true
			}
		}
	}
	m.mu.Unlock()
	merged := mergedPath(l)
	if mounted {
		merged = ml.Root
	}
	stage, err := os.MkdirTemp(l.Dir, "stage-")
	if err != nil {
		return ingest.Result{}, err
	}
	defer func() {
		filepath.WalkDir(stage, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o700)
			}
			return nil
		})
		os.RemoveAll(stage)
	}()
	sg := &stager{merged: merged, stage: stage}
	var deletes []string
	// replaced holds the paths whose inode changed: staged whole.
	var replaced []string
	under := func(p string, dirs []string) bool {
		for _, d := range dirs {
			if p == d || strings.HasPrefix(p, d+"/") {
				return true
			}
		}
		return false
	}
	err = filepath.WalkDir(merged, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(merged, p)
		if rel == "." {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		s, had := mf[rel]
		switch {
		case under(rel, replaced):
			return sg.entry(rel)
		case had && s.Ino != st.Ino:
			deletes = append(deletes, rel)
			if d.IsDir() {
				replaced = append(replaced, rel)
			}
			return sg.entry(rel)
		case had && s == stampOf(&st):
			return nil
		default:
			return sg.entry(rel)
		}
	})
	if err == nil {
		err = sg.finish()
	}
	if err != nil {
		return ingest.Result{}, fmt.Errorf("fake seal %s: %w", l.Dir, err)
	}
	var gone []string
	for rel := range mf {
		if rel == "." {
			continue
		}
		if _, err := os.Lstat(filepath.Join(merged, rel)); errors.Is(err, fs.ErrNotExist) {
			gone = append(gone, rel)
		}
	}
	slices.Sort(gone)
	for _, rel := range gone {
		if !under(rel, deletes) {
			deletes = append(deletes, rel)
		}
	}
	if len(deletes) > 0 {
		b := cas.NewBuilder(st, base)
		for _, rel := range deletes {
			if err := b.Delete(ctx, rel); err != nil {
				return ingest.Result{}, fmt.Errorf("fake seal %s: delete %s: %w", l.Dir, rel, err)
			}
		}
		if base, err = b.Write(ctx, st); err != nil {
			return ingest.Result{}, fmt.Errorf("fake seal %s: %w", l.Dir, err)
		}
	}
	// The root's own attributes are the merged root's, as an upper root's.
	attr, err := delta.ReadRootAttr(merged)
	if err != nil {
		return ingest.Result{}, err
	}
	if err := applyAttr(stage, &attr); err != nil {
		return ingest.Result{}, err
	}
	opts.Adopt = nil // the stage is this seal's own copy: nothing to hand over
	return ingest.Upper(ctx, st, base, stage, opts)
}

// stager builds an upper-directory-shaped copy of what changed.
type stager struct {
	merged, stage string
	// dirs are the staged directories, parents first: their modes and
	// times are set once their children are staged (finish).
	dirs []string
}

// entry copies merged/rel into stage/rel, creating the parents it needs
// with the merged parents' attributes, as an overlay's copy-up. A
// directory is staged alone: its children are staged as the walk reaches
// them.
func (s *stager) entry(rel string) error {
	parts := strings.Split(rel, "/")
	for i := 1; i <= len(parts); i++ {
		p := strings.Join(parts[:i], "/")
		if _, err := os.Lstat(filepath.Join(s.stage, p)); err == nil {
			continue
		}
		if err := s.copyNode(p); err != nil {
			return err
		}
	}
	return nil
}

// copyNode copies one file system entry (a directory without its
// children) with its mode, owner (if it may) and times.
func (s *stager) copyNode(rel string) error {
	src, dst := filepath.Join(s.merged, rel), filepath.Join(s.stage, rel)
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		os.Lchown(dst, int(st.Uid), int(st.Gid)) // only root may; the fake does without
		s.dirs = append(s.dirs, rel)
		return nil
	case unix.S_IFREG:
		if err := copyFile(src, dst); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
	default:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
	}
	os.Lchown(dst, int(st.Uid), int(st.Gid))
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return err
		}
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, dst, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
}

// finish gives the staged directories their modes and times, children
// first.
func (s *stager) finish() error {
	for _, rel := range slices.Backward(s.dirs) {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(s.merged, rel), &st); err != nil {
			return err
		}
		dst := filepath.Join(s.stage, rel)
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return err
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
