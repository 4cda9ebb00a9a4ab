package vfs

import (
	"context"
	"io/fs"
	"time"
)

// FileInfo describes one entry of a listing.
type FileInfo struct {
	// Path is the entry's absolute, cleaned slash path.
	Path    string
	Size    int64
	Mode    fs.FileMode // type bits and permissions, as fs.FileMode
	ModTime time.Time
	// Target is a symlink's target, "" otherwise.
	Target string
}

// IsDir reports whether the entry is a directory.
func (fi FileInfo) IsDir() bool { return fi.Mode.IsDir() }

// Match is one line Grep found.
type Match struct {
	Path string // absolute slash path of the file
	Line int    // 1-based line number
	Text string // the line without its newline
}

// GrepOptions narrows a Grep.
type GrepOptions struct {
	// Path is the file or directory to search; "" means the working
	// directory.
	Path string
	// Glob, when set, keeps only files whose base name matches it
	// (path.Match syntax).
	Glob string
	// IgnoreCase matches case-insensitively.
	IgnoreCase bool
	// MaxMatches stops the search after that many matches; 0 means no limit.
	MaxMatches int
}

// Backend is a file tree. Implementations are safe for concurrent use.
type Backend interface {
	// Read returns a regular file's contents. A directory is fs.ErrInvalid.
	Read(ctx context.Context, path string) ([]byte, error)
	// Write replaces path with data atomically (readers see the old or the
	// new contents, never a mix), creating missing parent directories. The
	// file gets mode 0644 when new and keeps its mode when replaced.
	Write(ctx context.Context, path string, data []byte) error
	// List returns the entries directly inside a directory, sorted by path.
	// Listing a file returns that file alone.
	List(ctx context.Context, path string) ([]FileInfo, error)
	// Glob returns the sorted absolute paths matching pattern. The pattern
	// is path.Match syntax per segment plus "**", which matches any number
	// of segments; a relative pattern is relative to the working directory.
	Glob(ctx context.Context, pattern string) ([]string, error)
	// Grep returns the lines matching the RE2 regular expression pattern in
	// the regular files under opts.Path, ordered by path then line. Files
	// that are not valid UTF-8 text (contain a NUL byte) are skipped.
	Grep(ctx context.Context, pattern string, opts GrepOptions) ([]Match, error)
	// Delete removes a file, a symlink or a whole directory tree. Deleting
	// a missing path is fs.ErrNotExist; deleting "/" is fs.ErrInvalid.
	Delete(ctx context.Context, path string) error
}

// ExecResult is the outcome of Executor.Exec.
type ExecResult struct {
	Output   []byte // stdout and stderr, interleaved as produced
	ExitCode int
}

// Executor is the optional capability of running a shell command against the
// tree (the way an agent's "execute" tool does). Sessions that embed a
// sandbox.Sandbox usually offer it through Run instead.
type Executor interface {
	Exec(ctx context.Context, command string) (ExecResult, error)
}
