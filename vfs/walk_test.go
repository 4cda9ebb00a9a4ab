package vfs_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/esf-dev/esf/vfs"
)

// tree is a minimal in-test vfs.ReadLister: a map from absolute path to
// contents, where a path ending in "/" in the constructor is a directory.
// It follows the Backend contract for List and Read and counts Lists, so
// tests can check that a walk stays under its root.
type tree struct {
	files map[string][]byte
	dirs  map[string]bool
	lists []string
	fail  map[string]error // List or Read of this path fails so
}

func newTree(entries map[string]string) *tree {
	t := &tree{files: map[string][]byte{}, dirs: map[string]bool{"/": true}}
	for p, data := range entries {
		dir := strings.HasSuffix(p, "/")
		p = path.Clean(p)
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			t.dirs[d] = true
		}
		if dir {
			t.dirs[p] = true
		} else {
			t.files[p] = []byte(data)
		}
	}
	return t
}

func (t *tree) info(p string) (vfs.FileInfo, bool) {
	if t.dirs[p] {
		return vfs.FileInfo{Path: p, Mode: fs.ModeDir | 0o755}, true
	}
	if d, ok := t.files[p]; ok {
		return vfs.FileInfo{Path: p, Mode: 0o644, Size: int64(len(d))}, true
	}
	return vfs.FileInfo{}, false
}

func (t *tree) List(ctx context.Context, p string) ([]vfs.FileInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t.lists = append(t.lists, p)
	if err := t.fail[p]; err != nil {
		return nil, err
	}
	fi, ok := t.info(p)
	if !ok {
		return nil, &fs.PathError{Op: "list", Path: p, Err: fs.ErrNotExist}
	}
	if !fi.IsDir() {
		return []vfs.FileInfo{fi}, nil
	}
	var out []vfs.FileInfo
	for _, m := range []map[string]bool{t.dirs, keys(t.files)} {
		for c := range m {
			if c != p && path.Dir(c) == p {
				fi, _ := t.info(c)
				out = append(out, fi)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func (t *tree) Read(ctx context.Context, p string) ([]byte, error) {
	if err := t.fail[p]; err != nil {
		return nil, err
	}
	if t.dirs[p] {
		return nil, &fs.PathError{Op: "read", Path: p, Err: fs.ErrInvalid}
	}
	d, ok := t.files[p]
	if !ok {
		return nil, &fs.PathError{Op: "read", Path: p, Err: fs.ErrNotExist}
	}
	return d, nil
}

func keys(m map[string][]byte) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}

func TestWalk(t *testing.T) {
	tr := newTree(map[string]string{
		"/r/a.txt":     "",
		"/r/b/c.txt":   "",
		"/r/b/d/e.txt": "",
		"/r/b-x.txt":   "",
		"/r/empty/":    "",
		"/r/skip/x":    "",
		"/other/y":     "",
	})
	var got []string
	err := vfs.Walk(context.Background(), tr, "/r", func(fi vfs.FileInfo) error {
		got = append(got, fi.Path)
		if fi.Path == "/r/skip" {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Depth first, children in path order; a skipped directory is visited
	// but not entered.
	want := []string{"/r", "/r/a.txt", "/r/b", "/r/b/c.txt", "/r/b/d", "/r/b/d/e.txt", "/r/b-x.txt", "/r/empty", "/r/skip"}
	if !slices.Equal(got, want) {
		t.Errorf("Walk order\n got %q\nwant %q", got, want)
	}
	for _, l := range tr.lists {
		if l != "/r" && !strings.HasPrefix(l, "/r/") || l == "/r/skip" {
			t.Errorf("Walk listed %q outside its root or inside a skipped dir", l)
		}
	}

	// A file root visits the file alone.
	got = nil
	if err := vfs.Walk(context.Background(), tr, "/r/b/c.txt", func(fi vfs.FileInfo) error {
		got = append(got, fi.Path)
		return nil
	}); err != nil || !slices.Equal(got, []string{"/r/b/c.txt"}) {
		t.Errorf("Walk(file) visited %q, %v", got, err)
	}

	// SkipDir on the root ends the walk without error.
	n := 0
	if err := vfs.Walk(context.Background(), tr, "/r", func(vfs.FileInfo) error { n++; return fs.SkipDir }); err != nil || n != 1 {
		t.Errorf("Walk with SkipDir on root: %d calls, %v", n, err)
	}

	// A missing root is the List error.
	if err := vfs.Walk(context.Background(), tr, "/nope", func(vfs.FileInfo) error { return nil }); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Walk(missing) = %v, want fs.ErrNotExist", err)
	}

	// fn's error stops the walk and is returned.
	stop := errors.New("stop")
	n = 0
	if err := vfs.Walk(context.Background(), tr, "/r", func(fi vfs.FileInfo) error {
		n++
		if fi.Path == "/r/b" {
			return stop
		}
		return nil
	}); !errors.Is(err, stop) || n != 3 {
		t.Errorf("Walk with failing fn: %d calls, %v; want 3 calls and the error", n, err)
	}

	// A List error below the root is returned, except fs.ErrNotExist (the
	// directory went away during the walk).
	tr.fail = map[string]error{"/r/b/d": fs.ErrPermission}
	if err := vfs.Walk(context.Background(), tr, "/r", func(vfs.FileInfo) error { return nil }); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("Walk with unlistable dir = %v, want fs.ErrPermission", err)
	}
	tr.fail = map[string]error{"/r/b/d": &fs.PathError{Op: "list", Path: "/r/b/d", Err: fs.ErrNotExist}}
	got = nil
	if err := vfs.Walk(context.Background(), tr, "/r/b", func(fi vfs.FileInfo) error {
		got = append(got, fi.Path)
		return nil
	}); err != nil || !slices.Equal(got, []string{"/r/b", "/r/b/c.txt", "/r/b/d"}) {
		t.Errorf("Walk with vanished dir visited %q, %v", got, err)
	}
}

func TestWalkCancelled(t *testing.T) {
	tr := newTree(map[string]string{"/a/b": "", "/a/c": "", "/a/d/e": ""})
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	err := vfs.Walk(ctx, tr, "/a", func(vfs.FileInfo) error {
		n++
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || n != 1 {
		t.Errorf("Walk after cancel: %d calls, %v; want 1 call and context.Canceled", n, err)
	}
}

func TestGlobWalk(t *testing.T) {
	tr := newTree(map[string]string{
		"/w/a.go":           "",
		"/w/b.txt":          "",
		"/w/sub/c.go":       "",
		"/w/sub/deep/d.go":  "",
		"/w/sub/deep/e.txt": "",
		"/w/sub-x.go":       "",
		"/w/empty/":         "",
		"/elsewhere/f.go":   "",
	})
	for _, tc := range []struct {
		pattern string
		want    []string
	}{
		{"/w/*.go", []string{"/w/a.go", "/w/sub-x.go"}},
		{"/w/*", []string{"/w/a.go", "/w/b.txt", "/w/empty", "/w/sub", "/w/sub-x.go"}},
		{"/w/**/*.go", []string{"/w/a.go", "/w/sub-x.go", "/w/sub/c.go", "/w/sub/deep/d.go"}},
		{"/w/sub/**", []string{"/w/sub", "/w/sub/c.go", "/w/sub/deep", "/w/sub/deep/d.go", "/w/sub/deep/e.txt"}},
		{"/w/**/deep", []string{"/w/sub/deep"}},
		{"/**/*.go", []string{"/elsewhere/f.go", "/w/a.go", "/w/sub-x.go", "/w/sub/c.go", "/w/sub/deep/d.go"}},
		{"/w/sub/c.go", []string{"/w/sub/c.go"}},
		{"/w/sub/c.go/*", nil},
		{"/w/*/*.txt", []string{"/w/sub/deep/e.txt"}[:0]},
		{"/w/*/*/*.txt", []string{"/w/sub/deep/e.txt"}},
		{"/w/?.go", []string{"/w/a.go"}},
		{"/w/[ab].*", []string{"/w/a.go", "/w/b.txt"}},
		{"/missing/**", nil},
		{"/w/nomatch*", nil},
	} {
		tr.lists = nil
		got, err := vfs.GlobWalk(context.Background(), tr, tc.pattern)
		if err != nil {
			t.Errorf("GlobWalk(%q): %v", tc.pattern, err)
			continue
		}
		if len(got) != 0 || len(tc.want) != 0 {
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("GlobWalk(%q)\n got %q\nwant %q", tc.pattern, got, tc.want)
			}
		}
		// The walk starts at the pattern's literal root.
		p, _ := vfs.CompilePattern(tc.pattern)
		for _, l := range tr.lists {
			if _, ok := vfs.Rel(p.Root(), l); !ok {
				t.Errorf("GlobWalk(%q) listed %q outside root %q", tc.pattern, l, p.Root())
			}
		}
	}
	if _, err := vfs.GlobWalk(context.Background(), tr, "/w/["); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("GlobWalk(bad pattern) = %v, want fs.ErrInvalid", err)
	}
	if _, err := vfs.GlobWalk(context.Background(), tr, "w/*"); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("GlobWalk(relative pattern) = %v, want fs.ErrInvalid", err)
	}
	tr.fail = map[string]error{"/w/sub": fs.ErrPermission}
	if _, err := vfs.GlobWalk(context.Background(), tr, "/w/**"); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("GlobWalk over an unlistable dir = %v, want fs.ErrPermission", err)
	}
}

func TestGrepWalk(t *testing.T) {
	tr := newTree(map[string]string{
		"/g/a.go":        "package a\n// needle one\nfunc A() {}\n// NEEDLE upper",
		"/g/b.txt":       "needle in text\r\nnothing\n",
		"/g/bin.dat":     "needle\x00binary\n",
		"/g/sub/c.go":    "x\nneedle deep\n",
		"/g/sub-note.md": "a needle\n",
		"/g/sub/none.go": "nothing here\n",
		"/g/dir.go/x.md": "needle under a dir named like a go file\n",
		"/other/z.go":    "needle elsewhere\n",
	})
	m := func(p string, line int, text string) vfs.Match { return vfs.Match{Path: p, Line: line, Text: text} }
	all := []vfs.Match{
		m("/g/a.go", 2, "// needle one"),
		m("/g/b.txt", 1, "needle in text"),
		m("/g/dir.go/x.md", 1, "needle under a dir named like a go file"),
		m("/g/sub-note.md", 1, "a needle"),
		m("/g/sub/c.go", 2, "needle deep"),
	}
	for _, tc := range []struct {
		name    string
		pattern string
		opts    vfs.GrepOptions
		want    []vfs.Match
	}{
		// Ordered by path then line: "/g/sub-note.md" sorts before
		// "/g/sub/c.go" ('-' < '/') although a depth-first walk meets
		// sub/ first.
		{"all", "needle", vfs.GrepOptions{Path: "/g"}, all},
		{"ignore case", "needle", vfs.GrepOptions{Path: "/g", IgnoreCase: true},
			append(all[:1:1], append([]vfs.Match{m("/g/a.go", 4, "// NEEDLE upper")}, all[1:]...)...)},
		{"glob keeps base names, files only", "needle", vfs.GrepOptions{Path: "/g", Glob: "*.go"},
			[]vfs.Match{all[0], all[4]}},
		{"regexp", "needle (one|deep)$", vfs.GrepOptions{Path: "/g"}, []vfs.Match{all[0], all[4]}},
		{"file path", "needle", vfs.GrepOptions{Path: "/g/b.txt"}, []vfs.Match{all[1]}},
		{"binary file path", "needle", vfs.GrepOptions{Path: "/g/bin.dat"}, nil},
		{"max 1", "needle", vfs.GrepOptions{Path: "/g", MaxMatches: 1}, all[:1]},
		{"max 2 inside one file", "//", vfs.GrepOptions{Path: "/g/a.go", MaxMatches: 2},
			[]vfs.Match{m("/g/a.go", 2, "// needle one"), m("/g/a.go", 4, "// NEEDLE upper")}},
		{"no match", "absent", vfs.GrepOptions{Path: "/g"}, nil},
		{"empty line match", "^$", vfs.GrepOptions{Path: "/g/sub"}, nil},
	} {
		got, err := vfs.GrepWalk(context.Background(), tr, tc.pattern, tc.opts)
		if err != nil {
			t.Errorf("%s: GrepWalk: %v", tc.name, err)
			continue
		}
		if len(got) != 0 || len(tc.want) != 0 {
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%s: GrepWalk(%q, %+v)\n got %v\nwant %v", tc.name, tc.pattern, tc.opts, got, tc.want)
			}
		}
	}

	for _, tc := range []struct {
		pattern string
		opts    vfs.GrepOptions
		want    error
	}{
		{"(", vfs.GrepOptions{Path: "/g"}, fs.ErrInvalid},
		{"x", vfs.GrepOptions{Path: "/g", Glob: "["}, fs.ErrInvalid},
		{"x", vfs.GrepOptions{Path: "/missing"}, fs.ErrNotExist},
	} {
		if _, err := vfs.GrepWalk(context.Background(), tr, tc.pattern, tc.opts); !errors.Is(err, tc.want) {
			t.Errorf("GrepWalk(%q, %+v) = %v, want %v", tc.pattern, tc.opts, err, tc.want)
		}
	}

	// A file that vanishes between List and Read is skipped; any other
	// Read failure is returned.
	tr.fail = map[string]error{"/g/b.txt": &fs.PathError{Op: "read", Path: "/g/b.txt", Err: fs.ErrNotExist}}
	if got, err := vfs.GrepWalk(context.Background(), tr, "needle", vfs.GrepOptions{Path: "/g"}); err != nil || len(got) != len(all)-1 {
		t.Errorf("GrepWalk with a vanished file = %v, %v; want %d matches", got, err, len(all)-1)
	}
	tr.fail = map[string]error{"/g/b.txt": fs.ErrPermission}
	if _, err := vfs.GrepWalk(context.Background(), tr, "needle", vfs.GrepOptions{Path: "/g"}); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("GrepWalk with an unreadable file = %v, want fs.ErrPermission", err)
	}
}

func TestGrepData(t *testing.T) {
	re, err := vfs.CompileGrep("x", vfs.GrepOptions{})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("y", 200<<10) + "x" // longer than bufio's default token
	for _, tc := range []struct {
		name string
		data string
		max  int
		want []int // matching line numbers; nil with binary=true means skipped
		bin  bool
	}{
		{"lines", "x\ny\nax\n", 0, []int{1, 3}, false},
		{"no final newline", "y\nx", 0, []int{2}, false},
		{"crlf", "x\r\ny\r\n", 0, []int{1}, false},
		{"empty", "", 0, nil, false},
		{"long line", "a\n" + long + "\nx\n", 0, []int{2, 3}, false},
		{"max", "x\nx\nx\n", 2, []int{1, 2}, false},
		{"binary", "x\n\x00", 0, nil, true},
	} {
		out, ok := vfs.GrepData(re, "/f", []byte(tc.data), tc.max, nil)
		if ok == tc.bin {
			t.Errorf("%s: GrepData text=%v, want %v", tc.name, ok, !tc.bin)
		}
		var lines []int
		for _, m := range out {
			lines = append(lines, m.Line)
			if m.Path != "/f" || strings.ContainsAny(m.Text, "\r\n") {
				t.Errorf("%s: match %+v has a wrong path or keeps its line end", tc.name, m)
			}
		}
		if !slices.Equal(lines, tc.want) {
			t.Errorf("%s: lines %v, want %v", tc.name, lines, tc.want)
		}
	}
	// max counts matches already in out (from earlier files).
	prev := []vfs.Match{{Path: "/e", Line: 1, Text: "x"}}
	if out, _ := vfs.GrepData(re, "/f", []byte("x\nx\n"), 2, prev); len(out) != 2 {
		t.Errorf("GrepData with max 2 and one earlier match returned %d matches, want 2", len(out))
	}
}

func TestCompileGrepIgnoreCase(t *testing.T) {
	re, err := vfs.CompileGrep("abc", vfs.GrepOptions{IgnoreCase: true})
	if err != nil {
		t.Fatal(err)
	}
	for s, want := range map[string]bool{"ABC": true, "aBc": true, "ab": false} {
		if got := re.MatchString(s); got != want {
			t.Errorf("ignore-case %q matches %q = %v, want %v", "abc", s, got, want)
		}
	}
	re, _ = vfs.CompileGrep("abc", vfs.GrepOptions{})
	if re.MatchString("ABC") {
		t.Error("case-sensitive pattern matched ABC")
	}
}

// ExampleGlobWalk shows the "**" dialect over a backend without search.
func ExampleGlobWalk() {
	tr := newTree(map[string]string{"/src/a.go": "", "/src/x/b.go": "", "/src/x/c.txt": ""})
	got, _ := vfs.GlobWalk(context.Background(), tr, "/src/**/*.go")
	fmt.Println(got)
	// Output: [/src/a.go /src/x/b.go]
}
