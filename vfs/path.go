package vfs

import (
	"fmt"
	"io/fs"
	"path"
	"strings"
)

// Resolve turns p into an absolute, cleaned slash path: "~" and "~/..."
// resolve against home, other relative paths against cwd. home and cwd must
// be absolute. An empty path or one holding a NUL byte is fs.ErrInvalid.
func Resolve(home, cwd, p string) (string, error) {
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return "", &fs.PathError{Op: "resolve", Path: p, Err: fs.ErrInvalid}
	}
	var base, rest string
	switch {
	case p == "~" || strings.HasPrefix(p, "~/"):
		base, rest = home, p[1:]
	case !strings.HasPrefix(p, "/"):
		base, rest = cwd, "/"+p
	default:
		return path.Clean(p), nil
	}
	// Check the base itself: an empty one joined with "/x" would look
	// absolute and quietly resolve against "/".
	if !strings.HasPrefix(base, "/") {
		return "", &fs.PathError{Op: "resolve", Path: p, Err: fmt.Errorf("home or cwd is not absolute: %w", fs.ErrInvalid)}
	}
	return path.Clean(base + rest), nil
}

// Rel is the relative spelling of the absolute path p under dir, or false
// when p is not dir or inside it.
func Rel(dir, p string) (string, bool) {
	dir, p = path.Clean(dir), path.Clean(p)
	if p == dir {
		return ".", true
	}
	if dir == "/" {
		return p[1:], true
	}
	if strings.HasPrefix(p, dir+"/") {
		return p[len(dir)+1:], true
	}
	return "", false
}

// Pattern is a compiled Glob pattern.
type Pattern struct {
	segs []string // "**" or a path.Match pattern per segment
}

// CompilePattern checks and splits an absolute glob pattern.
func CompilePattern(abs string) (*Pattern, error) {
	if !strings.HasPrefix(abs, "/") {
		return nil, &fs.PathError{Op: "glob", Path: abs, Err: fs.ErrInvalid}
	}
	p := &Pattern{}
	for _, s := range strings.Split(strings.Trim(path.Clean(abs), "/"), "/") {
		if s == "" {
			continue
		}
		if s != "**" {
			if _, err := path.Match(s, ""); err != nil {
				return nil, &fs.PathError{Op: "glob", Path: abs, Err: fmt.Errorf("%v: %w", err, fs.ErrInvalid)}
			}
		}
		p.segs = append(p.segs, s)
	}
	return p, nil
}

// Root is the longest leading directory of the pattern with no wildcard: the
// only place a walk needs to start from.
func (p *Pattern) Root() string {
	var lit []string
	for _, s := range p.segs {
		if s == "**" || strings.ContainsAny(s, `*?[\`) {
			break
		}
		lit = append(lit, s)
	}
	return "/" + strings.Join(lit, "/")
}

// Match reports whether the absolute path abs matches the pattern.
func (p *Pattern) Match(abs string) bool {
	var segs []string
	if t := strings.Trim(path.Clean(abs), "/"); t != "" {
		segs = strings.Split(t, "/")
	}
	return matchSegs(p.segs, segs)
}

func matchSegs(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := 0; i <= len(name); i++ {
				if matchSegs(pat[1:], name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}
