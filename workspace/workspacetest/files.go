package workspacetest

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"reflect"
	"slices"
	"testing"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// testFiles: the vfs.Backend half of a session, on one session, each
// subtest in its own directory under the working directory.
func (s *suite) testFiles(t *testing.T) {
	sess := s.create(t, nil)
	cwd := s.pwd(t, sess)
	abs := func(rel string) string { return path.Join(cwd, rel) }
	write := func(t *testing.T, files map[string]string) {
		t.Helper()
		ctx := s.ctx(t)
		for _, p := range slices.Sorted(maps.Keys(files)) {
			if err := sess.Write(ctx, p, []byte(files[p])); err != nil {
				t.Fatalf("Write(%q): %v", p, err)
			}
		}
	}

	t.Run("WriteRead", func(t *testing.T) {
		ctx := s.ctx(t)
		binary := make([]byte, 256*16)
		for i := range binary {
			binary[i] = byte(i)
		}
		long := bytes.Repeat([]byte("long line of text\n"), 4096)
		for _, tc := range []struct {
			name  string
			path  string
			steps [][]byte // written in turn; the last must be read back
		}{
			{"creates parents", "wst-files/rw/a/b/c.txt", [][]byte{[]byte("nested\n")}},
			{"overwrite shorter", "wst-files/rw/over.txt", [][]byte{long, []byte("short\n")}},
			{"overwrite longer", "wst-files/rw/grow.txt", [][]byte{[]byte("short\n"), long}},
			{"empty", "wst-files/rw/empty.txt", [][]byte{[]byte("not yet empty"), {}}},
			{"binary", "wst-files/rw/binary.dat", [][]byte{binary}},
		} {
			for _, data := range tc.steps {
				if err := sess.Write(ctx, tc.path, data); err != nil {
					t.Fatalf("%s: Write(%q, %d bytes): %v", tc.name, tc.path, len(data), err)
				}
			}
			want := tc.steps[len(tc.steps)-1]
			for _, p := range []string{tc.path, abs(tc.path)} {
				got, err := sess.Read(ctx, p)
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("%s: Read(%q) = %d bytes %q, %v; want %d bytes", tc.name, p, len(got), clip(got), err, len(want))
				}
			}
			if fi, err := sess.List(ctx, tc.path); err != nil || len(fi) != 1 || fi[0].Size != int64(len(want)) {
				t.Errorf("%s: List(%q) = %+v, %v; want one entry of size %d", tc.name, tc.path, fi, err, len(want))
			}
		}
	})

	t.Run("SameTreeAsRun", func(t *testing.T) {
		ctx := s.ctx(t)
		write(t, map[string]string{"wst-files/run/from-write.txt": "from Write\n"})
		if got := s.sh(t, sess, "cat wst-files/run/from-write.txt"); got != "from Write\n" {
			t.Errorf("cat of a file Write made = %q", got)
		}
		s.sh(t, sess, "echo from Run > wst-files/run/from-run.txt; echo more >> wst-files/run/from-write.txt")
		if got, err := sess.Read(ctx, "wst-files/run/from-run.txt"); err != nil || string(got) != "from Run\n" {
			t.Errorf("Read of a file Run made = %q, %v", got, err)
		}
		if got, err := sess.Read(ctx, "wst-files/run/from-write.txt"); err != nil || string(got) != "from Write\nmore\n" {
			t.Errorf("Read of a file Run appended to = %q, %v", got, err)
		}
	})

	t.Run("Modes", func(t *testing.T) {
		ctx := s.ctx(t)
		const p = "wst-files/modes/f.sh"
		write(t, map[string]string{p: "echo hi\n"})
		s.wantMode(t, sess, p, 0o644, "a new file")
		s.sh(t, sess, "chmod 755 "+p)
		s.wantMode(t, sess, p, 0o755, "after chmod 755")
		if err := sess.Write(ctx, p, []byte("echo replaced\n")); err != nil {
			t.Fatal(err)
		}
		s.wantMode(t, sess, p, 0o755, "a file replaced by Write")
		if got, _ := sess.Read(ctx, p); string(got) != "echo replaced\n" {
			t.Errorf("Read after replacing a chmod-ed file = %q", got)
		}
		fi, err := sess.List(ctx, "wst-files/modes")
		if err != nil || len(fi) != 1 || fi[0].Mode.IsDir() {
			t.Errorf("List of a dir Write created = %+v, %v", fi, err)
		}
		fi, err = sess.List(ctx, "wst-files")
		if err != nil || !slices.ContainsFunc(fi, func(f vfs.FileInfo) bool { return f.Path == abs("wst-files/modes") && f.IsDir() }) {
			t.Errorf("List(wst-files) = %+v, %v; want the directory %s among it", fi, err, abs("wst-files/modes"))
		}
	})

	t.Run("List", func(t *testing.T) {
		ctx := s.ctx(t)
		write(t, map[string]string{"wst-files/l/x": "1", "wst-files/l/y": "22", "wst-files/l/sub/z": "333"})
		dir := abs("wst-files/l")
		for _, p := range []string{"wst-files/l", dir, dir + "/", "wst-files/l/sub/.."} {
			fi, err := sess.List(ctx, p)
			if err != nil {
				t.Errorf("List(%q): %v", p, err)
				continue
			}
			var got []string
			for _, f := range fi {
				kind := "file"
				if f.IsDir() {
					kind = "dir"
				} else if f.Mode.IsRegular() {
					kind = fmt.Sprintf("file %d", f.Size)
				}
				got = append(got, f.Path+" "+kind)
			}
			want := []string{dir + "/sub dir", dir + "/x file 1", dir + "/y file 2"}
			if !slices.Equal(got, want) {
				t.Errorf("List(%q)\n got %q\nwant %q (direct children, sorted, absolute)", p, got, want)
			}
		}
		if fi, err := sess.List(ctx, "wst-files/l/x"); err != nil || len(fi) != 1 || fi[0].Path != dir+"/x" || fi[0].Size != 1 {
			t.Errorf("List(file) = %+v, %v; want the file alone", fi, err)
		}
		if err := sess.Delete(ctx, "wst-files/l/sub/z"); err != nil {
			t.Fatal(err)
		}
		if fi, err := sess.List(ctx, "wst-files/l/sub"); err != nil || len(fi) != 0 {
			t.Errorf("List(empty dir) = %+v, %v; want no entries and no error", fi, err)
		}
		_, err := sess.List(ctx, "wst-files/l/missing")
		wantErr(t, "List(missing)", err, fs.ErrNotExist)
		_, err = sess.List(ctx, "")
		wantErr(t, `List("")`, err, fs.ErrInvalid)
	})

	t.Run("Errors", func(t *testing.T) {
		ctx := s.ctx(t)
		write(t, map[string]string{"wst-files/e/f": "f"})
		_, err := sess.Read(ctx, "wst-files/e/missing")
		wantErr(t, "Read(missing)", err, fs.ErrNotExist)
		_, err = sess.Read(ctx, "wst-files/e")
		wantErr(t, "Read(directory)", err, fs.ErrInvalid)
		_, err = sess.Read(ctx, "")
		wantErr(t, `Read("")`, err, fs.ErrInvalid)
		_, err = sess.Read(ctx, "wst-files/e/f\x00x")
		wantErr(t, "Read(path with NUL)", err, fs.ErrInvalid)
		wantErr(t, `Write("")`, sess.Write(ctx, "", []byte("x")), fs.ErrInvalid)
		if err := sess.Write(ctx, "wst-files/e", []byte("x")); err == nil {
			t.Error("Write over a directory succeeded")
		}
		if fi, err := sess.List(ctx, "wst-files/e"); err != nil || len(fi) != 1 || fi[0].Path != abs("wst-files/e/f") {
			t.Errorf("after a Write over it, the directory lists %+v, %v", fi, err)
		}
	})

	t.Run("Glob", func(t *testing.T) {
		ctx := s.ctx(t)
		write(t, map[string]string{
			"wst-files/g/a.go": "", "wst-files/g/b.txt": "", "wst-files/g/sub-x.go": "",
			"wst-files/g/sub/c.go": "", "wst-files/g/sub/deep/d.go": "", "wst-files/g/sub/deep/e.txt": "",
		})
		g := abs("wst-files/g")
		for _, tc := range []struct {
			pattern string
			want    []string // relative to g
		}{
			{"wst-files/g/*.go", []string{"a.go", "sub-x.go"}},
			{g + "/*", []string{"a.go", "b.txt", "sub", "sub-x.go"}},
			{"wst-files/g/**/*.go", []string{"a.go", "sub-x.go", "sub/c.go", "sub/deep/d.go"}},
			{"wst-files/g/sub/**", []string{"sub", "sub/c.go", "sub/deep", "sub/deep/d.go", "sub/deep/e.txt"}},
			{"wst-files/g/**/deep", []string{"sub/deep"}},
			{"wst-files/g/*/*/*.txt", []string{"sub/deep/e.txt"}},
			{"wst-files/g/?.txt", []string{"b.txt"}},
			{"wst-files/g/[ab].*", []string{"a.go", "b.txt"}},
			{"./wst-files/x/../g/sub/c.go", []string{"sub/c.go"}},
			{"wst-files/g/nomatch*", nil},
			{"wst-files/missing/**", nil},
		} {
			var want []string
			for _, w := range tc.want {
				want = append(want, g+"/"+w)
			}
			got, err := sess.Glob(ctx, tc.pattern)
			if err != nil {
				t.Errorf("Glob(%q): %v", tc.pattern, err)
				continue
			}
			if len(got) != 0 || len(want) != 0 {
				if !reflect.DeepEqual(got, want) {
					t.Errorf("Glob(%q)\n got %q\nwant %q", tc.pattern, got, want)
				}
			}
		}
		_, err := sess.Glob(ctx, "wst-files/g/[")
		wantErr(t, "Glob(bad pattern)", err, fs.ErrInvalid)
	})

	t.Run("Grep", func(t *testing.T) {
		ctx := s.ctx(t)
		write(t, map[string]string{
			"wst-files/gr/a.go":        "package a\n// wst-needle one\nfunc A() {}\n// WST-NEEDLE upper\n",
			"wst-files/gr/b.txt":       "wst-needle in text\nnothing\n",
			"wst-files/gr/bin.dat":     "wst-needle\x00binary\n",
			"wst-files/gr/sub/c.go":    "x\nwst-needle deep\n",
			"wst-files/gr/sub-note.md": "a wst-needle\n",
		})
		g := abs("wst-files/gr")
		m := func(p string, line int, text string) vfs.Match {
			return vfs.Match{Path: g + "/" + p, Line: line, Text: text}
		}
		// Ordered by path, then line: sub-note.md before sub/c.go.
		all := []vfs.Match{m("a.go", 2, "// wst-needle one"), m("b.txt", 1, "wst-needle in text"), m("sub-note.md", 1, "a wst-needle"), m("sub/c.go", 2, "wst-needle deep")}
		upper := m("a.go", 4, "// WST-NEEDLE upper")
		for _, tc := range []struct {
			name    string
			pattern string
			opts    vfs.GrepOptions
			want    []vfs.Match
		}{
			{"relative dir", "wst-needle", vfs.GrepOptions{Path: "wst-files/gr"}, all},
			{"absolute dir", "wst-needle", vfs.GrepOptions{Path: g}, all},
			{"working directory", "wst-needle", vfs.GrepOptions{}, all},
			{"ignore case", "wst-needle", vfs.GrepOptions{Path: g, IgnoreCase: true}, []vfs.Match{all[0], upper, all[1], all[2], all[3]}},
			{"glob on base names", "wst-needle", vfs.GrepOptions{Path: g, Glob: "*.go"}, []vfs.Match{all[0], all[3]}},
			{"regexp", "wst-needle (one|deep)$", vfs.GrepOptions{Path: g}, []vfs.Match{all[0], all[3]}},
			{"file", "wst-needle", vfs.GrepOptions{Path: "wst-files/gr/b.txt"}, all[1:2]},
			{"binary file skipped", "wst-needle", vfs.GrepOptions{Path: g + "/bin.dat"}, nil},
			{"no match", "wst-absent", vfs.GrepOptions{Path: g}, nil},
		} {
			got, err := sess.Grep(ctx, tc.pattern, tc.opts)
			if err != nil {
				t.Errorf("%s: Grep(%q, %+v): %v", tc.name, tc.pattern, tc.opts, err)
				continue
			}
			if len(got) != 0 || len(tc.want) != 0 {
				if !reflect.DeepEqual(got, tc.want) {
					t.Errorf("%s: Grep(%q, %+v)\n got %v\nwant %v", tc.name, tc.pattern, tc.opts, got, tc.want)
				}
			}
		}
		for _, max := range []int{1, 3} {
			got, err := sess.Grep(ctx, "wst-needle", vfs.GrepOptions{Path: g, MaxMatches: max})
			if err != nil || len(got) != max {
				t.Errorf("Grep with MaxMatches %d = %v, %v; want %d matches", max, got, err, max)
			}
			for _, mt := range got {
				if !slices.Contains(all, mt) {
					t.Errorf("Grep with MaxMatches %d returned %v, not a real match", max, mt)
				}
			}
		}
		_, err := sess.Grep(ctx, "(", vfs.GrepOptions{Path: g})
		wantErr(t, "Grep(bad regexp)", err, fs.ErrInvalid)
		_, err = sess.Grep(ctx, "x", vfs.GrepOptions{Path: g, Glob: "["})
		wantErr(t, "Grep(bad Glob)", err, fs.ErrInvalid)
		_, err = sess.Grep(ctx, "x", vfs.GrepOptions{Path: "wst-files/missing"})
		wantErr(t, "Grep(missing path)", err, fs.ErrNotExist)
	})

	t.Run("Delete", func(t *testing.T) {
		ctx := s.ctx(t)
		write(t, map[string]string{
			"wst-files/d/f.txt": "f", "wst-files/d/keep.txt": "keep",
			"wst-files/d/sub/g.txt": "g", "wst-files/d/sub/deep/h.txt": "h",
		})
		if err := sess.Delete(ctx, "wst-files/d/f.txt"); err != nil {
			t.Fatalf("Delete(file): %v", err)
		}
		_, err := sess.Read(ctx, "wst-files/d/f.txt")
		wantErr(t, "Read after Delete", err, fs.ErrNotExist)
		if err := sess.Delete(ctx, abs("wst-files/d/sub")); err != nil {
			t.Fatalf("Delete(dir): %v", err)
		}
		_, err = sess.List(ctx, "wst-files/d/sub")
		wantErr(t, "List of a deleted directory", err, fs.ErrNotExist)
		_, err = sess.Read(ctx, "wst-files/d/sub/deep/h.txt")
		wantErr(t, "Read of a file under a deleted directory", err, fs.ErrNotExist)
		if res := s.run(t, sess, sandbox.Spec{}, "cat wst-files/d/sub/deep/h.txt"); res.ExitCode == 0 {
			t.Errorf("cat of a file under a deleted directory succeeded: %q", res.Stdout)
		}
		fi, err := sess.List(ctx, "wst-files/d")
		if err != nil || len(fi) != 1 || fi[0].Path != abs("wst-files/d/keep.txt") {
			t.Errorf("after the deletes, List(d) = %+v, %v; want keep.txt alone", fi, err)
		}
		wantErr(t, "Delete(missing)", sess.Delete(ctx, "wst-files/d/missing"), fs.ErrNotExist)
		wantErr(t, `Delete("")`, sess.Delete(ctx, ""), fs.ErrInvalid)
		for _, root := range []string{"/", "/..", "//", "/tmp/.."} {
			wantErr(t, fmt.Sprintf("Delete(%q)", root), sess.Delete(ctx, root), fs.ErrInvalid)
		}
		if got, err := sess.Read(ctx, "wst-files/d/keep.txt"); err != nil || string(got) != "keep" {
			t.Errorf("after refused Deletes of /, keep.txt reads %q, %v", got, err)
		}
	})
}

// wantMode checks the permission bits List reports for a regular file.
func (s *suite) wantMode(t *testing.T, sess workspace.Session, p string, perm fs.FileMode, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.h.OpTimeout)
	defer cancel()
	fi, err := sess.List(ctx, p)
	if err != nil || len(fi) != 1 {
		t.Errorf("%s: List(%q) = %+v, %v; want one entry", what, p, fi, err)
		return
	}
	if !fi[0].Mode.IsRegular() || fi[0].Mode.Perm() != perm {
		t.Errorf("%s: mode %v, want a regular file with %v", what, fi[0].Mode, perm)
	}
}
