package workspacetest

import (
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// testPaths: the path rule of vfs.Resolve, as the session's own shell sees
// it. A session with WorkDir "" starts in the provider's home, which the
// suite learns from pwd; every spelling of a path must name the file the
// shell finds at the absolute path. A second session with WorkDir "/tmp"
// checks that relative paths follow the working directory and "~" still
// means home (the same home: both sessions come from the same Spec).
func (s *suite) testPaths(t *testing.T) {
	sess := s.create(t, func(sp *workspace.Spec) { sp.WorkDir = "" })
	home := s.pwd(t, sess)
	ctx := s.ctx(t)
	up := strings.Repeat("../", strings.Count(home, "/")+3)
	for i, tc := range []struct{ p, abs string }{
		{"wst-rel.txt", path.Join(home, "wst-rel.txt")},
		{"./wst-dot/x.txt", path.Join(home, "wst-dot/x.txt")},
		{"wst-a/../wst-b.txt", path.Join(home, "wst-b.txt")},
		{"wst-dot//y.txt", path.Join(home, "wst-dot/y.txt")},
		{"~/wst-tilde.txt", path.Join(home, "wst-tilde.txt")},
		{"~/wst-dot/../wst-tilde2.txt", path.Join(home, "wst-tilde2.txt")},
		{"/tmp/wst-abs.txt", "/tmp/wst-abs.txt"},
		{"//tmp///wst-slashes.txt", "/tmp/wst-slashes.txt"},
		{up + "tmp/wst-up.txt", "/tmp/wst-up.txt"},
		{"/../../tmp/wst-root-up.txt", "/tmp/wst-root-up.txt"},
		{"/tmp/./wst-x/../wst-clean.txt", "/tmp/wst-clean.txt"},
	} {
		data := fmt.Sprintf("path case %d: %s\n", i, tc.p)
		if err := sess.Write(ctx, tc.p, []byte(data)); err != nil {
			t.Errorf("Write(%q): %v", tc.p, err)
			continue
		}
		if got, err := sess.Read(ctx, tc.abs); err != nil || string(got) != data {
			t.Errorf("Write(%q) then Read(%q) = %q, %v; want %q", tc.p, tc.abs, got, err, data)
		}
		if got, err := sess.Read(ctx, tc.p); err != nil || string(got) != data {
			t.Errorf("Read(%q) = %q, %v; want %q", tc.p, got, err, data)
		}
		if res := s.run(t, sess, sandbox.Spec{}, "cat "+quote(tc.abs)); string(res.Stdout) != data {
			t.Errorf("Write(%q), then cat %s in Run = %q (exit %d, stderr %q); want %q", tc.p, tc.abs, res.Stdout, res.ExitCode, res.Stderr, data)
		}
		if fi, err := sess.List(ctx, tc.p); err != nil || len(fi) != 1 || fi[0].Path != tc.abs {
			t.Errorf("List(%q) = %+v, %v; want the one entry %s", tc.p, fi, err, tc.abs)
		}
	}
	// "~" is the home directory itself.
	fi, err := sess.List(ctx, "~")
	if err != nil || !slices.ContainsFunc(fi, func(f vfs.FileInfo) bool { return f.Path == path.Join(home, "wst-rel.txt") }) {
		t.Errorf(`List("~") = %d entries, %v; want %s among them`, len(fi), err, path.Join(home, "wst-rel.txt"))
	}
	_, err = sess.Read(ctx, "~")
	wantErr(t, `Read("~")`, err, fs.ErrInvalid)
	// Glob and Grep answer with absolute paths for relative questions.
	if got, err := sess.Glob(ctx, "wst-*.txt"); err != nil || !slices.Contains(got, path.Join(home, "wst-rel.txt")) || !allAbsolute(got) {
		t.Errorf(`Glob("wst-*.txt") = %q, %v; want absolute paths including %s`, got, err, path.Join(home, "wst-rel.txt"))
	}
	if got, err := sess.Grep(ctx, "path case 0:", vfs.GrepOptions{Path: "."}); err != nil || len(got) != 1 || got[0].Path != path.Join(home, "wst-rel.txt") {
		t.Errorf(`Grep in "." = %+v, %v; want one match in %s`, got, err, path.Join(home, "wst-rel.txt"))
	}
	// Run's WorkDir follows the same rule.
	for _, tc := range []struct{ dir, want string }{
		{"~", home},
		{"~/wst-dot", path.Join(home, "wst-dot")},
		{"wst-dot/..", home},
		{up + "tmp", "/tmp"},
	} {
		res := s.run(t, sess, sandbox.Spec{WorkDir: tc.dir}, "pwd")
		if string(res.Stdout) != tc.want+"\n" {
			t.Errorf("pwd with WorkDir %q = %q (exit %d, stderr %q), want %q", tc.dir, res.Stdout, res.ExitCode, res.Stderr, tc.want)
		}
	}

	t.Run("SpecWorkDir", func(t *testing.T) {
		sess := s.create(t, func(sp *workspace.Spec) { sp.WorkDir = "/tmp" })
		ctx := s.ctx(t)
		if got := s.pwd(t, sess); got != "/tmp" {
			t.Fatalf("pwd in a session with WorkDir /tmp = %q", got)
		}
		if err := sess.Write(ctx, "wst-rel-b.txt", []byte("b\n")); err != nil {
			t.Fatal(err)
		}
		if got, err := sess.Read(ctx, "/tmp/wst-rel-b.txt"); err != nil || string(got) != "b\n" {
			t.Errorf("relative Write in WorkDir /tmp, Read(/tmp/wst-rel-b.txt) = %q, %v", got, err)
		}
		if got := s.sh(t, sess, "cat wst-rel-b.txt"); got != "b\n" {
			t.Errorf("cat of the relative file in Run = %q", got)
		}
		if err := sess.Write(ctx, "~/wst-home-b.txt", []byte("h\n")); err != nil {
			t.Fatal(err)
		}
		if got, err := sess.Read(ctx, path.Join(home, "wst-home-b.txt")); err != nil || string(got) != "h\n" {
			t.Errorf(`"~/wst-home-b.txt" in a session with WorkDir /tmp: Read(%s) = %q, %v`, path.Join(home, "wst-home-b.txt"), got, err)
		}
		if got, err := sess.Glob(ctx, "wst-rel-*.txt"); err != nil || !slices.Equal(got, []string{"/tmp/wst-rel-b.txt"}) {
			t.Errorf(`Glob("wst-rel-*.txt") in WorkDir /tmp = %q, %v`, got, err)
		}
	})
}

func allAbsolute(ps []string) bool {
	for _, p := range ps {
		if !strings.HasPrefix(p, "/") || path.Clean(p) != p {
			return false
		}
	}
	return true
}
