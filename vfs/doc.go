// Package vfs is the seam for a file tree an agent works on: read, write,
// list, glob, grep and delete by slash-separated path, wherever the tree lives
// (a local directory, a container, a remote sandbox).
//
// Paths. Every Backend takes absolute or relative slash paths; relative ones
// resolve against the backend's working directory, and "~" or "~/x" against
// its home. Resolve is the one implementation of that rule: backends call it
// instead of joining paths themselves, so "a/../../etc" cannot differ between
// providers. ".." never climbs above "/".
//
// Errors are the io/fs classes, so callers test them the same way for every
// backend: fs.ErrNotExist (missing path), fs.ErrExist, fs.ErrInvalid (a bad
// path or pattern, reading a directory), fs.ErrPermission. Backends wrap them
// with context in *fs.PathError.
//
// Glob and Grep are defined once here over List and Read (Walk, GlobWalk,
// GrepWalk) for backends without a server-side search; a backend with a
// better one must return the same answers.
package vfs
