package treediff_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/export"
	"github.com/esf-dev/esf/internal/testenv"
	"github.com/esf-dev/esf/treediff"
)

func requireGit(t *testing.T) {
	t.Helper()
	testenv.Require(t, "cmd:git") // the patch round trip needs git apply
}

// exportTo materialises root in a fresh directory.
func exportTo(t *testing.T, g cas.Getter, root cas.ID) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "x")
	if _, err := export.ToDir(context.Background(), g, root, dir, export.Options{NoXattrs: true}); err != nil {
		t.Fatalf("export %s: %v", root.Short(), err)
	}
	return dir
}

// gitApply applies patch inside dir the way a user would: plain git apply,
// outside any repository, under umask 022, without user configuration.
func gitApply(t *testing.T, dir string, patch []byte, args ...string) {
	t.Helper()
	pf := filepath.Join(t.TempDir(), "p.diff")
	if err := os.WriteFile(pf, patch, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", append([]string{"-c", `umask 022 && exec git apply "$@"`, "sh"}, append(args, pf)...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CEILING_DIRECTORIES="+filepath.Dir(dir), "GIT_CONFIG_NOSYSTEM=1",
		"HOME="+t.TempDir(), "GIT_CONFIG_GLOBAL=/dev/null")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git apply %v: %v\n%s\npatch:\n%s", args, err, out, clip(patch))
	}
}

func clip(b []byte) string {
	if len(b) > 20000 {
		return string(b[:20000]) + "\n...[clipped]"
	}
	return string(b)
}

// gitView lists what git can carry of a directory: each regular file's
// permission bits and content digest, each symlink's target. Directories are
// implied by their contents (git has no empty directories).
func gitView(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file %o %x", info.Mode().Perm(), sha256.Sum256(b))
		case d.Type()&fs.ModeSymlink != 0:
			tgt, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "symlink " + tgt
		case d.IsDir():
		default:
			out[rel] = "other " + d.Type().String()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameView(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for _, p := range sortedKeys(want) {
		if got[p] != want[p] {
			t.Errorf("%s: %q is %q, want %q", what, p, got[p], want[p])
		}
	}
	for _, p := range sortedKeys(got) {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: unexpected %q (%s)", what, p, got[p])
		}
	}
}

func lines(n int, tag string) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "line %d %s\n", i, tag)
	}
	return b.String()
}

func randomBytes(r *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return string(b)
}

// patchPair builds two trees that differ in every way a patch can carry.
func patchPair(t *testing.T, st cas.Store) (a, b cas.ID) {
	r := rand.New(rand.NewPCG(1, 2))
	f := func(c string) cas.Entry { return fileE(t, st, c, 0o644) }
	x := func(c string) cas.Entry { return fileE(t, st, c, 0o755) }
	text := lines(40, "")
	text2 := strings.Replace(strings.Replace(text, "line 3 \n", "line three\n", 1), "line 30 \n", "", 1) + "appended\n"
	bin := randomBytes(r, 4096) + "\x00"
	bin2 := bin[:100] + "changed" + bin[107:]
	big := strings.Repeat("a large text file line\n", 3000) // over the test's text limit
	big2 := "first line changed\n" + big[23:]
	a = build(t, st, cas.ZeroID,
		put("text.txt", f(text)),
		put("noeol", f("a\nb")),
		put("addeol", f("x")),
		put("empty2full", f("")),
		put("full2empty", f("bye\n")),
		put("emptyexec", f("")),
		put("exec.sh", f("#!/bin/sh\necho hi\n")),
		put("modeonly", x("m\n")),
		put("bin", f(bin)),
		put("bin_del", f(bin)),
		put("bin2text", f(bin)),
		put("big", f(big)),
		put("sym", symE("target/one")),
		put("sym_del", symE("gone")),
		put("sym2file", symE("s")),
		put("file2sym", f("will be a link\n")),
		put("f2d", f("file then dir\n")),
		put("d2f/inner/x", f("x\n")),
		put("d2f/y", f("y\n")),
		put("gone/dir/deep", f("deep\n")),
		put("gone/top", f("top\n")),
		put("sp ace.txt", f("one two\n")),
		put("é.txt", f("accent\n")),
		put("keep/same", f("same\n")),
		put("keep/hl", f("hard\n")),
	)
	b = build(t, st, a,
		put("text.txt", f(text2)),
		put("noeol", f("a\nc")),
		put("addeol", f("x\n")),
		put("empty2full", f("now\n")),
		put("full2empty", f("")),
		put("emptyexec", x("")),
		put("exec.sh", x("#!/bin/sh\necho bye\n")),
		put("modeonly", f("m\n")),
		put("bin", f(bin2)),
		del("bin_del"),
		put("bin2text", f("text now\n")),
		put("big", f(big2)),
		put("sym", symE("target/two")),
		del("sym_del"),
		put("sym2file", f("a file now\n")),
		put("file2sym", symE("../elsewhere")),
		put("f2d", dirE(0o755)),
		put("f2d/a", f("in a new dir\n")),
		put("f2d/sub/b", x("deeper\n")),
		del("d2f"),
		put("d2f", f("dir then file\n")),
		del("gone"),
		put("new/deep/dir/file", f("brand new\n")),
		put("new/empty", f("")),
		put("new/bin", f(randomBytes(r, 70000))),
		put("sp ace.txt", f("one three\n")),
		put("é.txt", f("accent changed\n")),
		put("qu\"ote", f("q\n")),
		put("back\\slash", f("b\n")),
		put("tab\there", f("t\n")),
		put("new\nline", f("n\n")),
		put("trailing space ", f("s\n")),
		put("keep/hl", f("hard, changed\n")),
		link("keep/hl2", "keep/hl"),
	)
	return a, b
}

// TestPatchGitApply proves the patch contract with git itself: applied to
// an export of a, the patch yields an export of b (content, exec bits,
// symlinks, deletions, empty and binary files), and reversed, a again.
func TestPatchGitApply(t *testing.T) {
	requireGit(t)
	defer treediff.SetTextLimit(32 << 10)()
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			st := sc.open(t)
			ctx := context.Background()
			a, b := patchPair(t, st)
			var patch bytes.Buffer
			if err := treediff.Patch(ctx, st, a, b, &patch); err != nil {
				t.Fatal(err)
			}
			dir := exportTo(t, st, a)
			wantA := gitView(t, dir)
			wantB := gitView(t, exportTo(t, st, b))
			gitApply(t, dir, patch.Bytes())
			sameView(t, "a+patch", gitView(t, dir), wantB)
			gitApply(t, dir, patch.Bytes(), "-R")
			sameView(t, "a+patch-patch", gitView(t, dir), wantA)

			// The other way round.
			var back bytes.Buffer
			if err := treediff.Patch(ctx, st, b, a, &back); err != nil {
				t.Fatal(err)
			}
			dir = exportTo(t, st, b)
			gitApply(t, dir, back.Bytes())
			sameView(t, "b+patch(b,a)", gitView(t, dir), wantA)

			// From nothing: the whole tree as additions.
			var full bytes.Buffer
			if err := treediff.Patch(ctx, st, cas.ZeroID, b, &full); err != nil {
				t.Fatal(err)
			}
			dir = filepath.Join(t.TempDir(), "empty")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			gitApply(t, dir, full.Bytes())
			sameView(t, "nothing+patch(0,b)", gitView(t, dir), wantB)
		})
	}
}

// TestPatchFormat pins the sections git expects for the simple cases.
func TestPatchFormat(t *testing.T) {
	st := mem.New()
	ctx := context.Background()
	f := func(c string, mode uint32) cas.Entry { return fileE(t, st, c, mode) }
	a := build(t, st, cas.ZeroID, put("m", f("same\n", 0o644)), put("e", f("", 0o644)),
		put("fifo", cas.Entry{Type: cas.TypeFIFO, Attr: cas.Attr{Mode: 0o644}}))
	b := build(t, st, a, put("m", f("same\n", 0o755)), put("n", f("1\n2\n", 0o644)), del("e"),
		put("fifo", cas.Entry{Type: cas.TypeFIFO, Attr: cas.Attr{Mode: 0o600}}),
		put("fifo2", cas.Entry{Type: cas.TypeFIFO}), put("owner", func() cas.Entry { e := f("o", 0o600); return e }()))
	c := build(t, st, b, put("owner", func() cas.Entry { e := f("o", 0o640); e.UID = 7; e.MtimeNs = 9; return e }()))
	var buf bytes.Buffer
	if err := treediff.Patch(ctx, st, a, b, &buf); err != nil {
		t.Fatal(err)
	}
	want := `diff --git a/e b/e
deleted file mode 100644
index e69de29bb2d1d6434b8b29ae775ad8c2e48c5391..0000000000000000000000000000000000000000
diff --git a/m b/m
old mode 100644
new mode 100755
diff --git a/n b/n
new file mode 100644
index 0000000000000000000000000000000000000000..1191247b6d9a206f6ba3d8ac79e26d041dd86941
--- /dev/null
+++ b/n
@@ -0,0 +1,2 @@
+1
+2
diff --git a/owner b/owner
new file mode 100644
index 0000000000000000000000000000000000000000..883ad6e8ef9a7392b45f6fc9e7d53c88f502388b
--- /dev/null
+++ b/owner
@@ -0,0 +1 @@
+o
\ No newline at end of file
`
	if buf.String() != want {
		t.Errorf("patch:\n%s\nwant:\n%s", buf.String(), want)
	}
	// What git does not track makes no section at all.
	buf.Reset()
	if err := treediff.Patch(ctx, st, b, c, &buf); err != nil || buf.Len() != 0 {
		t.Errorf("owner, mode bits and mtime only: %v %q", err, buf.String())
	}
}

// TestPatchRandom round-trips random tree pairs through git apply. Replay
// a failure with ESF_TREEDIFF_SEED.
func TestPatchRandom(t *testing.T) {
	requireGit(t)
	seed := seedFromEnv(t, "ESF_TREEDIFF_SEED")
	r := rand.New(rand.NewPCG(seed, 0))
	st := mem.New()
	ctx := context.Background()
	for round := range 8 {
		names := []string{"a", "b", "c d", "é", "x\"y"}
		contents := []string{"", "1\n", "1\n2\n3\n", "1\n2\nthree\n", "bin\x00ary", "no eol"}
		randomOps := func(n int, files map[string]bool) []op {
			var ops []op
			for range n {
				depth := 1 + r.IntN(3)
				parts := make([]string, depth)
				for i := range parts {
					parts[i] = names[r.IntN(len(names))]
				}
				p := strings.Join(parts, "/")
				switch r.IntN(5) {
				case 0:
					ops = append(ops, del(p))
				case 1:
					// Dangling targets: git apply resolves new paths through
					// symlinks the patch deletes (see Patch), so a link into
					// the tree that later becomes a directory can make it
					// refuse a correct patch.
					ops = append(ops, put(p, symE([]string{"t1", "../t2", "/nonexistent/t3"}[r.IntN(3)])))
				default:
					mode := []uint32{0o644, 0o755}[r.IntN(2)]
					ops = append(ops, put(p, fileE(t, st, contents[r.IntN(len(contents))], mode)))
				}
			}
			return ops
		}
		// Without empty directories: git knows none, so it cannot turn a
		// directory holding one into a file (see Patch).
		a := withoutEmptyDirs(t, st, buildLenient(t, st, cas.ZeroID, randomOps(30, nil)))
		b := withoutEmptyDirs(t, st, buildLenient(t, st, a, randomOps(15, nil)))
		var patch bytes.Buffer
		if err := treediff.Patch(ctx, st, a, b, &patch); err != nil {
			t.Fatal(err)
		}
		if patch.Len() == 0 {
			continue
		}
		dir := exportTo(t, st, a)
		gitApply(t, dir, patch.Bytes())
		want := gitView(t, exportTo(t, st, b))
		sameView(t, fmt.Sprintf("seed %d round %d", seed, round), gitView(t, dir), want)
		if t.Failed() {
			t.Fatalf("seed %d round %d; patch:\n%s", seed, round, clip(patch.Bytes()))
		}
	}
}

// withoutEmptyDirs deletes every directory of root that holds no file or
// symlink at any depth.
func withoutEmptyDirs(t *testing.T, st cas.Store, root cas.ID) cas.ID {
	t.Helper()
	flat := flatten(t, st, root)
	full := map[string]bool{"": true}
	for p, n := range flat {
		if n.dir {
			continue
		}
		for q := p; q != ""; {
			i := lastSlash(q)
			if i < 0 {
				q = ""
			} else {
				q = q[:i]
			}
			full[q] = true
		}
	}
	var ops []op
	for p, n := range flat {
		if n.dir && !full[p] {
			ops = append(ops, del(p))
		}
	}
	return build(t, st, root, ops...)
}

func seedFromEnv(t *testing.T, name string) uint64 {
	t.Helper()
	var seed uint64
	if s := os.Getenv(name); s != "" {
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatalf("%s=%q: %v", name, s, err)
		}
	} else {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (replay with %s=%d)", seed, name, seed)
	return seed
}

func TestPatchCorruptBlob(t *testing.T) {
	st := mem.New()
	ctx := context.Background()
	e := fileE(t, st, "some content\n", 0o644)
	b := build(t, st, cas.ZeroID, put("f", e))
	if err := st.Corrupt(e.ID); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := treediff.Patch(ctx, st, cas.ZeroID, b, &buf); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("patch over a corrupt blob: %v", err)
	}
}
