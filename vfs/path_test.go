package vfs_test

import (
	"errors"
	"io/fs"
	"testing"

	"github.com/esf-dev/esf/vfs"
)

// TestResolve pins THE path rule every backend and provider shares.
func TestResolve(t *testing.T) {
	const home, cwd = "/home/user", "/work/dir"
	for _, tc := range []struct {
		home, cwd, p string
		want         string // "" means fs.ErrInvalid
	}{
		{home, cwd, "/etc/passwd", "/etc/passwd"},
		{home, cwd, "f.txt", "/work/dir/f.txt"},
		{home, cwd, "./f.txt", "/work/dir/f.txt"},
		{home, cwd, ".", "/work/dir"},
		{home, cwd, "a/../b", "/work/dir/b"},
		{home, cwd, "a/./b//c/", "/work/dir/a/b/c"},
		{home, cwd, "..", "/work"},
		{home, cwd, "../../../../..", "/"},
		{home, cwd, "../../../../../etc", "/etc"},
		{home, cwd, "/../../etc", "/etc"},
		{home, cwd, "//x///y", "/x/y"},
		{home, cwd, "/", "/"},
		{home, cwd, "~", "/home/user"},
		{home, cwd, "~/", "/home/user"},
		{home, cwd, "~/x/y", "/home/user/x/y"},
		{home, cwd, "~/../../..", "/"},
		// Only a leading "~" or "~/" is home; the rest are plain names.
		{home, cwd, "~user/x", "/work/dir/~user/x"},
		{home, cwd, "a/~/b", "/work/dir/a/~/b"},
		{home, cwd, "/~", "/~"},
		{"/", "/", "~/x", "/x"},
		{"/", "/", "x", "/x"},
		{home, cwd, "", ""},
		{home, cwd, "a\x00b", ""},
		{home, cwd, "/a\x00", ""},
		// home and cwd must be absolute: an empty or relative base is an
		// error, not a path quietly resolved against "/".
		{home, "", "x", ""},
		{home, "rel", "x", ""},
		{"", cwd, "~/x", ""},
		{"", cwd, "~", ""},
		{"home", cwd, "~", ""},
		// An absolute p needs neither base.
		{"", "", "/x/../y", "/y"},
		// A base that is not absolute does not matter when unused.
		{"", cwd, "x", "/work/dir/x"},
		{home, "", "~/x", "/home/user/x"},
	} {
		got, err := vfs.Resolve(tc.home, tc.cwd, tc.p)
		if tc.want == "" {
			if !errors.Is(err, fs.ErrInvalid) {
				t.Errorf("Resolve(%q, %q, %q) = %q, %v; want fs.ErrInvalid", tc.home, tc.cwd, tc.p, got, err)
			}
			var pe *fs.PathError
			if err != nil && !errors.As(err, &pe) {
				t.Errorf("Resolve(%q, %q, %q) error %v is not a *fs.PathError", tc.home, tc.cwd, tc.p, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Resolve(%q, %q, %q) = %q, %v; want %q", tc.home, tc.cwd, tc.p, got, err, tc.want)
		}
	}
}

func TestRel(t *testing.T) {
	for _, tc := range []struct {
		dir, p string
		want   string
		ok     bool
	}{
		{"/a", "/a", ".", true},
		{"/a", "/a/b/c", "b/c", true},
		{"/a/", "/a/b", "b", true},
		{"/", "/", ".", true},
		{"/", "/x/y", "x/y", true},
		{"/a", "/ab", "", false},
		{"/a", "/", "", false},
		{"/a/b", "/a", "", false},
		{"/a", "/a/../b", "", false},
		{"/a", "/a/./b/", "b", true},
	} {
		got, ok := vfs.Rel(tc.dir, tc.p)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Rel(%q, %q) = %q, %v; want %q, %v", tc.dir, tc.p, got, ok, tc.want, tc.ok)
		}
	}
}

func TestCompilePatternInvalid(t *testing.T) {
	for _, p := range []string{
		"",           // not absolute
		"*.go",       // not absolute
		"a/**",       // not absolute
		"/a/[/b",     // bad class
		"/a/b[",      // unterminated class
		"/a/**/x\\",  // trailing escape
		"/a/[]a]/[-", // second segment bad
	} {
		if _, err := vfs.CompilePattern(p); !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("CompilePattern(%q) error = %v, want fs.ErrInvalid", p, err)
		}
	}
}

func TestPatternRoot(t *testing.T) {
	for _, tc := range []struct{ pattern, root string }{
		{"/", "/"},
		{"/a/b/c", "/a/b/c"},
		{"/a/b/*.go", "/a/b"},
		{"/a/**/c", "/a"},
		{"/**", "/"},
		{"/*/b", "/"},
		{"/a/b?/c", "/a"},
		{"/a/[bc]/d", "/a"},
		{"/a/\\*/d", "/a"},
		{"/a/./b/../c/*", "/a/c"},
	} {
		p, err := vfs.CompilePattern(tc.pattern)
		if err != nil {
			t.Fatalf("CompilePattern(%q): %v", tc.pattern, err)
		}
		if got := p.Root(); got != tc.root {
			t.Errorf("CompilePattern(%q).Root() = %q, want %q", tc.pattern, got, tc.root)
		}
	}
}

// TestPatternMatch pins the glob dialect: path.Match per segment, "*" never
// crosses "/", and "**" is any number of whole segments, zero included.
func TestPatternMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		yes, no []string
	}{
		{"/a/*.go",
			[]string{"/a/x.go", "/a/.go", "/a/.hidden.go", "/a/x.go/"},
			[]string{"/a/b/x.go", "/a", "/a/x.gox", "/b/x.go", "/x.go"}},
		{"/a/**",
			[]string{"/a", "/a/b", "/a/b/c/d"},
			[]string{"/", "/ab", "/b/a"}},
		{"/a/**/*.go",
			[]string{"/a/x.go", "/a/b/x.go", "/a/b/c/x.go"},
			[]string{"/a", "/a/b", "/a/b/x.txt", "/x.go", "/ab/x.go"}},
		{"/**/x",
			[]string{"/x", "/a/x", "/a/b/x"},
			[]string{"/", "/a/x/y", "/ax"}},
		{"/**",
			[]string{"/", "/a", "/a/b/c"},
			nil},
		{"/a/**/b/**/c",
			[]string{"/a/b/c", "/a/x/b/y/c", "/a/b/b/c", "/a/x/y/b/c"},
			[]string{"/a/b", "/a/c", "/a/c/b", "/a/b/c/d"}},
		{"/a/**/**",
			[]string{"/a", "/a/b/c"},
			[]string{"/b"}},
		{"/a/?",
			[]string{"/a/b"},
			[]string{"/a/bc", "/a", "/a/b/c"}},
		{"/a/[bc]/d",
			[]string{"/a/b/d", "/a/c/d"},
			[]string{"/a/e/d", "/a/bc/d"}},
		{"/a/b",
			[]string{"/a/b", "/a/b/", "//a//b", "/a/./b", "/a/x/../b"},
			[]string{"/a", "/a/b/c", "/a/B"}},
		{"/",
			[]string{"/", "//"},
			[]string{"/a"}},
		// A "**" inside a segment is not the recursive form: it is two
		// path.Match stars and stays inside one segment.
		{"/a/x**",
			[]string{"/a/x", "/a/xyz"},
			[]string{"/a/x/y"}},
		{"/a/\\*",
			[]string{"/a/*"},
			[]string{"/a/b"}},
	} {
		p, err := vfs.CompilePattern(tc.pattern)
		if err != nil {
			t.Fatalf("CompilePattern(%q): %v", tc.pattern, err)
		}
		for _, s := range tc.yes {
			if !p.Match(s) {
				t.Errorf("pattern %q does not match %q, want match", tc.pattern, s)
			}
		}
		for _, s := range tc.no {
			if p.Match(s) {
				t.Errorf("pattern %q matches %q, want no match", tc.pattern, s)
			}
		}
	}
}
