package vfs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
)

// Lister is the part of a Backend a walk needs.
type Lister interface {
	List(ctx context.Context, path string) ([]FileInfo, error)
}

// Walk calls fn for every entry under root (root included), depth first in
// path order. It does not follow symlinks. fn returning fs.SkipDir on a
// directory skips it; any other error stops the walk.
func Walk(ctx context.Context, l Lister, root string, fn func(FileInfo) error) error {
	infos, err := l.List(ctx, root)
	if err != nil {
		return err
	}
	// List of a file returns the file itself; of a directory its children.
	if len(infos) == 1 && infos[0].Path == path.Clean(root) && !infos[0].IsDir() {
		return fn(infos[0])
	}
	self := FileInfo{Path: path.Clean(root), Mode: fs.ModeDir | 0o755}
	if err := fn(self); err != nil {
		if errors.Is(err, fs.SkipDir) {
			return nil
		}
		return err
	}
	return walkChildren(ctx, l, infos, fn)
}

func walkChildren(ctx context.Context, l Lister, infos []FileInfo, fn func(FileInfo) error) error {
	for _, fi := range infos {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := fn(fi)
		if errors.Is(err, fs.SkipDir) {
			continue
		}
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			continue
		}
		kids, err := l.List(ctx, fi.Path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed while we walked
		}
		if err != nil {
			return err
		}
		if err := walkChildren(ctx, l, kids, fn); err != nil {
			return err
		}
	}
	return nil
}

// GlobWalk implements Backend.Glob over List. pattern must already be
// absolute (Resolve it first).
func GlobWalk(ctx context.Context, l Lister, pattern string) ([]string, error) {
	p, err := CompilePattern(pattern)
	if err != nil {
		return nil, err
	}
	var out []string
	err = Walk(ctx, l, p.Root(), func(fi FileInfo) error {
		if p.Match(fi.Path) {
			out = append(out, fi.Path)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // nothing under a missing root matches
	}
	if err != nil {
		return nil, err
	}
	sort.Strings(out)
	return out, nil
}

// ReadLister is the part of a Backend a grep walk needs.
type ReadLister interface {
	Lister
	Read(ctx context.Context, path string) ([]byte, error)
}

// CompileGrep compiles a Grep pattern with its options, so every backend
// rejects the same patterns with fs.ErrInvalid.
func CompileGrep(pattern string, opts GrepOptions) (*regexp.Regexp, error) {
	if opts.IgnoreCase {
		pattern = "(?i)" + pattern
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, &fs.PathError{Op: "grep", Path: pattern, Err: fmt.Errorf("%v: %w", err, fs.ErrInvalid)}
	}
	if opts.Glob != "" {
		if _, err := path.Match(opts.Glob, ""); err != nil {
			return nil, &fs.PathError{Op: "grep", Path: opts.Glob, Err: fmt.Errorf("%v: %w", err, fs.ErrInvalid)}
		}
	}
	return re, nil
}

// GrepData appends the matches of re in one file's data. It returns false when
// the file is binary (holds a NUL byte) and was skipped.
func GrepData(re *regexp.Regexp, file string, data []byte, max int, out []Match) ([]Match, bool) {
	if bytes.IndexByte(data, 0) >= 0 {
		return out, false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, len(data)+1)
	for n := 1; sc.Scan(); n++ {
		if max > 0 && len(out) >= max {
			break
		}
		if re.Match(sc.Bytes()) {
			out = append(out, Match{Path: file, Line: n, Text: sc.Text()})
		}
	}
	return out, true
}

// GrepWalk implements Backend.Grep over List and Read. opts.Path must
// already be absolute (Resolve it first).
func GrepWalk(ctx context.Context, b ReadLister, pattern string, opts GrepOptions) ([]Match, error) {
	re, err := CompileGrep(pattern, opts)
	if err != nil {
		return nil, err
	}
	var out []Match
	err = Walk(ctx, b, opts.Path, func(fi FileInfo) error {
		if opts.MaxMatches > 0 && len(out) >= opts.MaxMatches {
			return fs.SkipAll
		}
		if !fi.Mode.IsRegular() {
			return nil
		}
		if opts.Glob != "" {
			if ok, _ := path.Match(opts.Glob, path.Base(fi.Path)); !ok {
				return nil
			}
		}
		data, err := b.Read(ctx, fi.Path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		out, _ = GrepData(re, fi.Path, data, opts.MaxMatches, out)
		return nil
	})
	if errors.Is(err, fs.SkipAll) {
		err = nil
	}
	// The walk meets "d/x" before "d-y" (it finishes d/ first) but the
	// contract orders by path; each file's matches are contiguous and in
	// line order, so a stable sort by path is enough.
	sort.SliceStable(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, err
}
