// Package rootfs confines file access to one host directory the way a
// chroot would, without chroot: every path is resolved by the kernel with
// openat2(2) relative to an O_PATH descriptor of the directory (the root).
//
// What the resolve flags guarantee, for each lookup on its own:
//
//   - RESOLVE_IN_ROOT: the descriptor acts as "/" for the lookup. ".." at
//     the top stays at the top, and an absolute path or symlink target
//     ("/usr/lib", "x -> /etc") starts again at the root, so a container's
//     image resolves as the container sees it and a link planted to point
//     at the host's /etc names the root's own etc. A relative link such as
//     "x -> ../../../etc" is clamped the same way.
//   - RESOLVE_NO_MAGICLINKS: /proc/<pid>/{root,cwd,fd/N,exe} style links
//     are refused (ELOOP): they jump to whatever inode they name and would
//     step past any root.
//   - RESOLVE_NO_XDEV (Options.NoXDev): the lookup may not cross a mount
//     point, for callers whose root holds nothing mounted (EXDEV otherwise).
//
// The kernel answers EAGAIN when a concurrent rename anywhere on the
// system might have let ".." race out of the root; it asks the caller to
// retry, and OpenFD does, a bounded number of times.
//
// Operations on a name (create, unlink, rename, mkdir) resolve the parent
// directory inside the root (Parent) and act on the last component alone
// with an *at syscall, which never follows it. Operations that follow a
// path (open, stat) resolve it whole and then act on that inode only.
// Reopen turns an O_PATH descriptor into a readable one through
// /proc/self/fd, which names the inode, never a lookup, so the type check
// done on the O_PATH descriptor holds for what is opened.
//
// Not covered: a root whose own directory is renamed or unmounted while a
// Root is open (the descriptor keeps naming the old inode); hard links
// made by someone else to files outside (a hard link is the inode itself,
// no resolution is involved); races of the caller's own multi-step
// operations (MkdirAll, RemoveAll, a Parent followed by an *at call) with
// a writer inside the root, beyond each step staying inside it; resource
// limits (disk, inodes, depth). Errors are bare unix.Errno values (or
// *fs.PathError from Open) so callers map them once at their boundary.
//
// A Root holds one descriptor and is safe for concurrent use; it keeps
// the directory's mount busy while open, so callers that must let a mount
// go (workspace/esf) open one per operation.
package rootfs
