package export

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// treeReader reads one tree; tests substitute one that skips the decoder's
// validation to prove the exporter's own checks.
type treeReader func(ctx context.Context, g cas.Getter, id cas.ID) (*dirTree, error)

// dirTree is what an export reads of one directory: its attributes and its
// entries in order. Read from the store it is a cas.TreeView, or for a
// tree over viewMax bytes a scan (cas.ScanTree) of a tree already checked
// whole, so a huge directory is exported one decoded entry at a time
// without its encoding held in memory either.
type dirTree struct {
	cas.Attr
	n     int
	entry func(i int) cas.Entry
	// scan, when set, replaces n and entry: it calls fn with each entry.
	scan func(fn func(*cas.Entry) error) error
}

// each calls fn with every entry in order; fn may keep e.
func (t *dirTree) each(fn func(e *cas.Entry) error) error {
	if t.scan != nil {
		return t.scan(func(e *cas.Entry) error {
			ent := *e
			return fn(&ent)
		})
	}
	for i := range t.n {
		ent := t.entry(i)
		if err := fn(&ent); err != nil {
			return err
		}
	}
	return nil
}

// viewMax is the largest tree an export holds as a view (its bytes and
// four more an entry); a larger one (a directory of some 16k entries or
// more) is scanned twice instead: once to check it whole before anything
// of it is written, once to export it.
const viewMax = 1 << 20

// readView reads the tree id as a view, or checks it and returns a scan.
func readView(ctx context.Context, g cas.Getter, id cas.ID) (*dirTree, error) {
	v, err := cas.ReadTreeViewUpTo(ctx, g, id, viewMax)
	if err != nil {
		return nil, err
	}
	if v != nil {
		return &dirTree{Attr: v.Attr, n: v.Len(), entry: v.Entry}, nil
	}
	t := &dirTree{}
	err = cas.ScanTree(ctx, g, id, func(a *cas.Attr) error { t.Attr = *a; return nil },
		func(*cas.Entry) error { t.n++; return nil })
	if err != nil {
		return nil, err
	}
	t.scan = func(fn func(*cas.Entry) error) error { return cas.ScanTree(ctx, g, id, nil, fn) }
	return t, nil
}

const dirFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

// ToDir materialises root into dest. dest must not exist (its parent must) or
// be an empty directory; a symlink, a non-directory or a non-empty directory
// is ErrFailedPrecondition. dest takes the root tree's mode, owner, xattrs
// and mtime. See the package documentation for the safety argument, the
// order of operations and what a failed export leaves behind.
func ToDir(ctx context.Context, g cas.Getter, root cas.ID, dest string, opts Options) (Stats, error) {
	return toDir(ctx, g, root, dest, opts, readView)
}

func toDir(ctx context.Context, g cas.Getter, root cas.ID, dest string, opts Options, read treeReader) (Stats, error) {
	opts = opts.withDefaults()
	x := &dirExporter{
		ctx:         ctx,
		g:           g,
		opts:        opts,
		log:         opts.Logger,
		readTree:    read,
		chown:       !opts.NoOwnership && os.Geteuid() == 0,
		euid:        os.Geteuid(),
		egid:        os.Getegid(),
		namedTemps:  forceNamedTemps,
		noEmptyPath: forceProcLink,
		buf:         make([]byte, bufSize),
		links:       map[string]linkFirst{},
		warned:      map[string]bool{},
	}
	x.priv = privFilter{preserve: opts.PreservePrivileged, d: &x.stats.Dropped}
	if err := x.run(root, dest); err != nil {
		return x.stats, fmt.Errorf("export %s to %s: %w", root.Short(), dest, err)
	}
	x.log.Debug("exported tree", "root", root.Short(), "dest", dest, "files", x.stats.Files,
		"dirs", x.stats.Dirs, "bytes", x.stats.Bytes, "skipped", x.stats.Skipped, "dropped", x.stats.Dropped.String())
	return x.stats, nil
}

type dirExporter struct {
	ctx      context.Context
	g        cas.Getter
	opts     Options
	log      *slog.Logger
	readTree treeReader
	chown    bool
	buf      []byte
	stats    Stats
	rootFD   int
	// links maps a link group to where its first member was created.
	links map[string]linkFirst
	seq   int // temporary file names
	// namedTemps: the file system has no O_TMPFILE (or forceNamedTemps);
	// noEmptyPath: linkat(AT_EMPTY_PATH) was refused.
	namedTemps, noEmptyPath bool
	euid, egid              int
	proc                    int // 0 unknown, 1 /proc/self/fd usable, -1 not
	warned                  map[string]bool
	priv                    privFilter
}

type linkFirst struct {
	dir   string // directory of the first member, relative to dest
	name  string
	entry cas.Entry
}

func (x *dirExporter) run(root cas.ID, dest string) error {
	// Read the root first: a missing or corrupt root must not create dest.
	t, err := x.readTree(x.ctx, x.g, root)
	if err != nil {
		return err
	}
	if err := x.ctx.Err(); err != nil {
		return err
	}
	fd, err := openDest(dest)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	x.rootFD = fd
	// Private while we fill it; it takes the root's own mode at the end.
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return fmt.Errorf("chmod destination: %w", err)
	}
	// New files take our group, or dest's on a file system mounted grpid:
	// when that differs, every file is chowned.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || int(st.Gid) != x.egid {
		x.egid = -1
	}
	if err := x.fillDir(fd, t, ""); err != nil {
		return err
	}
	if err := x.finishDir(fd, &t.Attr, "."); err != nil {
		return fmt.Errorf("root: %w", err)
	}
	x.stats.Dirs++
	return nil
}

// openDest opens dest, creating it if missing, and insists it is an empty
// directory reached without following a final symlink.
func openDest(dest string) (int, error) {
	// A trailing slash would make the kernel follow a final symlink.
	if p := strings.TrimRight(dest, "/"); p != "" {
		dest = p
	}
	fd, err := unix.Open(dest, dirFlags, 0)
	if err == unix.ENOENT {
		if err := unix.Mkdir(dest, 0o700); err != nil && err != unix.EEXIST {
			if err == unix.ENOENT {
				return -1, fmt.Errorf("create destination: parent of %s missing: %w", dest, ErrNotFound)
			}
			return -1, &os.PathError{Op: "mkdir", Path: dest, Err: err}
		}
		fd, err = unix.Open(dest, dirFlags, 0)
	}
	switch err {
	case nil:
	case unix.ELOOP, unix.ENOTDIR:
		// O_NOFOLLOW|O_DIRECTORY on a symlink gives either.
		return -1, fmt.Errorf("destination %s is not a directory (symlinks are not followed): %w", dest, ErrFailedPrecondition)
	default:
		return -1, &os.PathError{Op: "open", Path: dest, Err: err}
	}
	empty, err := dirEmpty(fd)
	if err == nil && !empty {
		err = fmt.Errorf("destination %s is not empty: %w", dest, ErrFailedPrecondition)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// dirEmpty reads fd's directory through a fresh open file description, so
// fd's own offset is left alone.
func dirEmpty(fd int) (bool, error) {
	rfd, err := unix.Openat(fd, ".", dirFlags, 0)
	if err != nil {
		return false, fmt.Errorf("open destination: %w", err)
	}
	f := os.NewFile(uintptr(rfd), "dest")
	defer f.Close()
	names, err := f.Readdirnames(1)
	if err == io.EOF {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("read destination: %w", err)
	}
	return len(names) == 0, nil
}

// fillDir creates t's entries in the directory fd, which is dir (relative to
// dest) and which the export created and holds open.
func (x *dirExporter) fillDir(fd int, t *dirTree, dir string) error {
	return t.each(func(e *cas.Entry) error {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		if err := checkEntry(e); err != nil {
			if dir == "" {
				return err
			}
			return fmt.Errorf("%s: %w", dir, err)
		}
		rel := joinPath(dir, e.Name)
		if e.Type == cas.TypeDir {
			// Errors from below carry their own path.
			return x.dir(fd, e, rel)
		}
		if err := x.leaf(fd, e, dir); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		return nil
	})
}

func (x *dirExporter) dir(parent int, e *cas.Entry, rel string) error {
	t, err := x.readTree(x.ctx, x.g, e.ID)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if err := unix.Mkdirat(parent, e.Name, 0o700); err != nil {
		return fmt.Errorf("%s: mkdir: %w", rel, err)
	}
	fd, err := unix.Openat(parent, e.Name, dirFlags, 0)
	if err != nil {
		return fmt.Errorf("%s: open: %w", rel, err)
	}
	// One descriptor per level, closed as soon as the level is done.
	defer unix.Close(fd)
	if err := x.fillDir(fd, t, rel); err != nil {
		return err
	}
	if err := x.finishDir(fd, &t.Attr, rel); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	x.stats.Dirs++
	return nil
}

// finishDir gives a populated directory its attributes.
func (x *dirExporter) finishDir(fd int, a *cas.Attr, rel string) error {
	if x.chown {
		if err := unix.Fchown(fd, int(a.UID), int(a.GID)); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if err := x.setXattrs(a.Xattrs, rel, func(n string, v []byte) error { return unix.Fsetxattr(fd, n, v, 0) }); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, a.Mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if err := futimens(fd, a.MtimeNs); err != nil {
		return fmt.Errorf("set mtime: %w", err)
	}
	return nil
}

// leaf creates the non-directory e in the directory fd (dir, relative to
// dest), or links it to its group's first member.
func (x *dirExporter) leaf(fd int, e *cas.Entry, dir string) error {
	if e.LinkGroup != "" {
		if first, ok := x.links[e.LinkGroup]; ok {
			if !sameContent(&first.entry, e) {
				return fmt.Errorf("link group %q: members differ in type or content: %w", e.LinkGroup, ErrCorrupt)
			}
			if err := x.link(first, fd, e.Name); err != nil {
				return err
			}
			x.stats.Links++
			return nil
		}
	}
	var created bool
	var err error
	switch e.Type {
	case cas.TypeFile:
		created, err = true, x.file(fd, e, joinPath(dir, e.Name))
	case cas.TypeSymlink:
		created, err = true, x.symlink(fd, e, joinPath(dir, e.Name))
	default:
		created, err = x.special(fd, e, joinPath(dir, e.Name))
	}
	if err != nil || !created {
		return err
	}
	if e.LinkGroup != "" {
		x.links[e.LinkGroup] = linkFirst{dir: dir, name: e.Name, entry: *e}
	}
	return nil
}

// file writes a regular file as an unnamed temporary file (O_TMPFILE) in
// its directory, or where the file system has none under a temporary name,
// completes it and only then links or renames it to its final name, so
// that name never shows partial or unverified content.
func (x *dirExporter) file(dirfd int, e *cas.Entry, rel string) (err error) {
	tmp, fd, err := x.createTemp(dirfd, e.Name)
	if err != nil {
		return err
	}
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
		if err != nil && tmp != "" {
			unix.Unlinkat(dirfd, tmp, 0)
		}
	}()
	done, n, err := x.copyVerified(fd, e)
	if err != nil {
		return err
	}
	if !done {
		var w io.Writer = fdWriter(fd)
		if len(e.Holes) > 0 {
			w = &sparseWriter{fd: fd, holes: e.Holes}
		}
		if n, err = copyBlob(x.ctx, x.g, e, w, x.buf, &x.opts); err != nil {
			return err
		}
	}
	if len(e.Holes) > 0 {
		if err := unix.Ftruncate(fd, n); err != nil {
			return fmt.Errorf("truncate: %w", err)
		}
	}
	// A new file is already ours (no directory of the export is setgid
	// while it runs, and dest has our group, see run): chown only to
	// someone else.
	if x.chown && (int(e.UID) != x.euid || int(e.GID) != x.egid) {
		if err := unix.Fchown(fd, int(e.UID), int(e.GID)); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if err := x.setXattrs(e.Xattrs, rel, func(n string, v []byte) error { return unix.Fsetxattr(fd, n, v, 0) }); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, x.priv.mode(e.Type, e.Mode, rel)); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if err := futimens(fd, e.MtimeNs); err != nil {
		return fmt.Errorf("set mtime: %w", err)
	}
	if tmp == "" {
		if err := x.linkTemp(fd, dirfd, e.Name); err != nil {
			return fmt.Errorf("link into place: %w", err)
		}
		cerr := unix.Close(fd)
		fd = -1
		if cerr != nil {
			unix.Unlinkat(dirfd, e.Name, 0)
			return fmt.Errorf("close: %w", cerr)
		}
	} else {
		cerr := unix.Close(fd)
		fd = -1
		if cerr != nil {
			return fmt.Errorf("close: %w", cerr)
		}
		if err := renameNoReplace(dirfd, tmp, e.Name); err != nil {
			return fmt.Errorf("rename into place: %w", err)
		}
	}
	x.stats.Files++
	x.stats.Bytes += n
	return nil
}

// forceNamedTemps makes every export write its files under temporary
// names, as on a file system without O_TMPFILE; forceProcLink links
// unnamed files through /proc, as without CAP_DAC_READ_SEARCH (for tests).
var forceNamedTemps, forceProcLink bool

// createTemp creates an empty private file in dirfd: unnamed (O_TMPFILE,
// tmp is "") where the file system allows, else under a fresh temporary
// name, never final (the name the file will take).
//
// An unnamed file saves a directory operation per file: creating and
// renaming a named one adds, removes and adds a directory entry, linking
// an unnamed one adds one (measured here: ~30 % less time per small file).
func (x *dirExporter) createTemp(dirfd int, final string) (string, int, error) {
	if !x.namedTemps {
		fd, err := unix.Openat(dirfd, ".", unix.O_WRONLY|unix.O_TMPFILE|unix.O_CLOEXEC, 0o600)
		if err == nil {
			return "", fd, nil
		}
		if err != unix.EOPNOTSUPP && err != unix.EISDIR && err != unix.EINVAL && err != unix.ENOENT {
			return "", -1, fmt.Errorf("create: %w", err)
		}
		// No O_TMPFILE here (EISDIR: a kernel that predates it).
		x.namedTemps = true
	}
	for range 100 {
		x.seq++
		name := ".esf-export-" + strconv.Itoa(x.seq) + ".tmp"
		if name == final {
			continue
		}
		fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == unix.EEXIST {
			// The tree has an entry of that name; try the next.
			continue
		}
		if err != nil {
			return "", -1, fmt.Errorf("create: %w", err)
		}
		return name, fd, nil
	}
	return "", -1, fmt.Errorf("create: no free temporary name")
}

// linkTemp gives the unnamed file fd the name name in dirfd, failing if it
// exists (linkat never replaces). linkat(AT_EMPTY_PATH) needs
// CAP_DAC_READ_SEARCH; without it, the file's /proc magic link names that
// inode and nothing else.
func (x *dirExporter) linkTemp(fd, dirfd int, name string) error {
	if !x.noEmptyPath {
		err := unix.Linkat(fd, "", dirfd, name, unix.AT_EMPTY_PATH)
		if err != unix.ENOENT && err != unix.EPERM {
			return err
		}
		x.noEmptyPath = true
	}
	return unix.Linkat(unix.AT_FDCWD, procFD(fd), dirfd, name, unix.AT_SYMLINK_FOLLOW)
}

// renameNoReplace moves old to new in dirfd, failing if new exists.
func renameNoReplace(dirfd int, old, new string) error {
	err := unix.Renameat2(dirfd, old, dirfd, new, unix.RENAME_NOREPLACE)
	if err != unix.EINVAL && err != unix.ENOSYS {
		return err
	}
	// The filesystem lacks RENAME_NOREPLACE; link is no-replace too.
	if err := unix.Linkat(dirfd, old, dirfd, new, 0); err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, old, 0)
}

func (x *dirExporter) symlink(dirfd int, e *cas.Entry, rel string) (err error) {
	if err := unix.Symlinkat(e.Target, dirfd, e.Name); err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	defer func() {
		if err != nil {
			unix.Unlinkat(dirfd, e.Name, 0)
		}
	}()
	if x.chown {
		if err := unix.Fchownat(dirfd, e.Name, int(e.UID), int(e.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	// Linux ignores a symlink's mode; there is nothing to chmod.
	if err := x.setXattrsAt(dirfd, e, rel); err != nil {
		return err
	}
	if err := utimensNoFollow(dirfd, e.Name, e.MtimeNs); err != nil {
		return fmt.Errorf("set mtime: %w", err)
	}
	x.stats.Symlinks++
	return nil
}

// special creates a fifo or device node; created is false when the kernel
// refused a device for lack of privilege and it was skipped.
func (x *dirExporter) special(dirfd int, e *cas.Entry, rel string) (created bool, err error) {
	var mode uint32
	var dev uint64
	switch e.Type {
	case cas.TypeFIFO:
		mode = unix.S_IFIFO
	case cas.TypeCharDev:
		mode, dev = unix.S_IFCHR, unix.Mkdev(e.Major, e.Minor)
	case cas.TypeBlockDev:
		mode, dev = unix.S_IFBLK, unix.Mkdev(e.Major, e.Minor)
	default:
		return false, fmt.Errorf("unknown type %d: %w", e.Type, ErrCorrupt)
	}
	if x.priv.device(e.Type, rel) {
		x.log.Debug("export: dropped device node", "path", rel, "type", e.Type.String(), "major", e.Major, "minor", e.Minor)
		return false, nil
	}
	if err := unix.Mknodat(dirfd, e.Name, mode|0o600, int(dev)); err != nil {
		if err == unix.EPERM && e.Type != cas.TypeFIFO {
			x.log.Warn("export: skipped device node: not permitted", "path", rel,
				"type", e.Type.String(), "major", e.Major, "minor", e.Minor)
			x.stats.Skipped++
			return false, nil
		}
		return false, fmt.Errorf("mknod: %w", err)
	}
	defer func() {
		if err != nil {
			unix.Unlinkat(dirfd, e.Name, 0)
		}
	}()
	if x.chown {
		if err := unix.Fchownat(dirfd, e.Name, int(e.UID), int(e.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return false, fmt.Errorf("chown: %w", err)
		}
	}
	if err := x.setXattrsAt(dirfd, e, rel); err != nil {
		return false, err
	}
	if err := chmodNoFollow(dirfd, e.Name, x.priv.mode(e.Type, e.Mode, rel)); err != nil {
		return false, fmt.Errorf("chmod: %w", err)
	}
	if err := utimensNoFollow(dirfd, e.Name, e.MtimeNs); err != nil {
		return false, fmt.Errorf("set mtime: %w", err)
	}
	x.stats.Others++
	return true, nil
}

// link makes name in dirfd a hard link to the group's first member. It finds
// the member again by walking the export's own directories from dest without
// following symlinks, and links without AT_SYMLINK_FOLLOW, so even a
// hand-made tree cannot turn the link into a path out of dest.
func (x *dirExporter) link(first linkFirst, dirfd int, name string) error {
	err := x.linkVia(first, dirfd, name, false)
	if errors.Is(err, unix.EACCES) {
		// A directory on the way took its mode already (finishDir) and it
		// denies search, which only CAP_DAC_OVERRIDE passes: open the way
		// for the link, as its owner, and close it again.
		err = x.linkVia(first, dirfd, name, true)
	}
	return err
}

// linkVia links first to name in dirfd, reaching first from the export's
// root; widen lets each directory on the way be searched for the while
// (see link).
func (x *dirExporter) linkVia(first linkFirst, dirfd int, name string, widen bool) (err error) {
	src := x.rootFD
	type narrow struct {
		parent int
		name   string
		mode   uint32
	}
	var fds []int
	var restore []narrow
	defer func() {
		for i := len(restore) - 1; i >= 0; i-- {
			r := restore[i]
			if cerr := unix.Fchmodat(r.parent, r.name, r.mode, 0); cerr != nil && err == nil {
				err = fmt.Errorf("link to %s: restore the mode of %s: %w", joinPath(first.dir, first.name), r.name, cerr)
			}
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if first.dir != "" {
		for _, c := range strings.Split(first.dir, "/") {
			if err := cas.ValidName(c); err != nil {
				return fmt.Errorf("link: %w", err)
			}
			next, err := unix.Openat(src, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("link to %s: open %s: %w", joinPath(first.dir, first.name), c, err)
			}
			fds = append(fds, next)
			if widen {
				var st unix.Stat_t
				if err := unix.Fstat(next, &st); err != nil {
					return fmt.Errorf("link to %s: stat %s: %w", joinPath(first.dir, first.name), c, err)
				}
				if mode := st.Mode & 0o7777; mode&0o100 == 0 {
					if err := unix.Fchmodat(src, c, mode|0o100, 0); err != nil {
						return fmt.Errorf("link to %s: open the way through %s: %w", joinPath(first.dir, first.name), c, err)
					}
					restore = append(restore, narrow{src, c, mode})
				}
			}
			src = next
		}
	}
	if err := unix.Linkat(src, first.name, dirfd, name, 0); err != nil {
		return fmt.Errorf("link to %s: %w", joinPath(first.dir, first.name), err)
	}
	return nil
}

// setXattrs applies xs with set, skipping with a warning what the filesystem
// or our privileges refuse.
func (x *dirExporter) setXattrs(xs []cas.Xattr, rel string, set func(name string, val []byte) error) error {
	if x.opts.NoXattrs {
		return nil
	}
	for _, xa := range x.priv.xattrs(xs, rel) {
		err := set(xa.Name, xa.Value)
		switch {
		case err == nil:
		case err == unix.ENOTSUP || err == unix.EPERM:
			x.skipXattr(rel, xa.Name, err)
		default:
			return fmt.Errorf("set xattr %s: %w", xa.Name, err)
		}
	}
	return nil
}

func (x *dirExporter) skipXattr(rel, name string, err error) {
	x.stats.Skipped++
	// Once per name: a tree full of one refused xattr is one problem.
	lvl := slog.LevelDebug
	if !x.warned[name] {
		x.warned[name] = true
		lvl = slog.LevelWarn
	}
	x.log.Log(x.ctx, lvl, "export: skipped xattr", "path", rel, "xattr", name, "err", err)
}

// setXattrsAt sets the xattrs of a symlink, fifo or device, which cannot be
// opened for fsetxattr, through the /proc magic link of their directory.
func (x *dirExporter) setXattrsAt(dirfd int, e *cas.Entry, rel string) error {
	if x.opts.NoXattrs {
		return nil
	}
	xs := x.priv.xattrs(e.Xattrs, rel)
	if len(xs) == 0 {
		return nil
	}
	if !x.procUsable() {
		for _, xa := range xs {
			x.skipXattr(rel, xa.Name, errors.New("/proc/self/fd unavailable"))
		}
		return nil
	}
	p := procFD(dirfd) + "/" + e.Name
	return x.setXattrs(xs, rel, func(n string, v []byte) error { return unix.Lsetxattr(p, n, v, 0) })
}

func (x *dirExporter) procUsable() bool {
	if x.proc == 0 {
		x.proc = -1
		var st unix.Stat_t
		if err := unix.Stat(procFD(x.rootFD), &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			x.proc = 1
		}
	}
	return x.proc > 0
}

func procFD(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// chmodNoFollow sets the mode of a node the export created in dirfd without
// ever following a symlink. fchmodat2 does that directly (Linux 6.6); where
// it is missing (x/sys reports EOPNOTSUPP, as the kernel does for a
// symlink), pin the node with O_PATH, check it is not a symlink, and chmod it
// through its /proc magic link, which names that inode and nothing else.
func chmodNoFollow(dirfd int, name string, mode uint32) error {
	err := unix.Fchmodat(dirfd, name, mode, unix.AT_SYMLINK_NOFOLLOW)
	if err != unix.EOPNOTSUPP {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return fmt.Errorf("%s is a symlink: %w", name, unix.ELOOP)
	}
	return unix.Chmod(procFD(fd), mode)
}

// futimens sets atime and mtime of fd to ns (utimensat with a NULL path).
func futimens(fd int, ns int64) error {
	ts := [2]unix.Timespec{unix.NsecToTimespec(ns), unix.NsecToTimespec(ns)}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func utimensNoFollow(dirfd int, name string, ns int64) error {
	ts := []unix.Timespec{unix.NsecToTimespec(ns), unix.NsecToTimespec(ns)}
	return unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// fdWriter writes to a raw descriptor, completing short writes.
type fdWriter int

func (w fdWriter) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := unix.Write(int(w), p[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			return n, io.ErrShortWrite
		}
		n += m
	}
	return n, nil
}
