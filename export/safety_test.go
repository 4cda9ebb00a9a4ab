package export

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/errdefs"
)

func fileEntry(t *testing.T, s cas.Putter, name, content string) cas.Entry {
	id, size := putBlob(t, s, content)
	return cas.Entry{Name: name, Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, ID: id, Size: size}
}

func symlinkEntry(name, target string) cas.Entry {
	return cas.Entry{Name: name, Type: cas.TypeSymlink, Attr: cas.Attr{Mode: 0o777}, Target: target, Size: int64(len(target))}
}

// TestDecoderRejectsEscapes stores hand-encoded trees that the validating
// encoder would refuse and proves that neither export writes anything
// outside dest: the decoder rejects every one of them as corrupt.
func TestDecoderRejectsEscapes(t *testing.T) {
	out := sentinel(t)
	s := mem.New()
	pwned := func(name string) cas.Entry { return fileEntry(t, s, name, "pwned") }
	child := putRaw(t, s, &cas.Tree{Attr: cas.Attr{Mode: 0o755}, Entries: []cas.Entry{pwned("pwned")}})
	linked := func(name, group string) cas.Entry {
		e := pwned(name)
		e.LinkGroup, e.Nlink = group, 2
		return e
	}
	cases := map[string][]cas.Entry{
		"dotdot dir":            {{Name: "..", Type: cas.TypeDir, ID: child}},
		"dotdot file":           {pwned("..")},
		"dot":                   {pwned(".")},
		"slash path":            {pwned("x/../../pwned")},
		"absolute name":         {pwned(out + "/pwned")},
		"empty name":            {pwned("")},
		"nul in name":           {pwned("a\x00b")},
		"dotdot symlink":        {symlinkEntry("..", out)},
		"link group dotdot":     {linked("a", "../outside/victim"), linked("b", "../outside/victim")},
		"link group absolute":   {linked("a", out+"/victim"), linked("b", out+"/victim")},
		"link group inner ..":   {linked("a", "x/../victim"), linked("b", "x/../victim")},
		"duplicate name":        {symlinkEntry("x", out), {Name: "x", Type: cas.TypeDir, ID: child}},
		"unsorted":              {{Name: "y", Type: cas.TypeDir, ID: child}, symlinkEntry("x", out)},
		"symlink target w/ nul": {symlinkEntry("x", out+"\x00/victim")},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			before := snapshot(t, out)
			bad := putRaw(t, s, &cas.Tree{Attr: cas.Attr{Mode: 0o755}, Entries: entries})
			// Once as the root, once nested below a valid directory, so the
			// export has already started when it meets the bad tree.
			nested := putRaw(t, s, &cas.Tree{Attr: cas.Attr{Mode: 0o755}, Entries: []cas.Entry{
				pwned("a-first"), {Name: "d", Type: cas.TypeDir, ID: bad},
			}})
			for _, root := range []cas.ID{bad, nested} {
				dest := filepath.Join(t.TempDir(), "out")
				_, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true})
				if !errors.Is(err, cas.ErrCorrupt) {
					t.Fatalf("ToDir: err = %v, want ErrCorrupt", err)
				}
				if _, err := ToTar(context.Background(), s, root, io.Discard, Options{PreservePrivileged: true}); !errors.Is(err, cas.ErrCorrupt) {
					t.Fatalf("ToTar: err = %v, want ErrCorrupt", err)
				}
				if root == bad {
					if _, err := os.Lstat(dest); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("a corrupt root created dest")
					}
				}
			}
			checkUntouched(t, out, before)
		})
	}
}

// TestHostileTreesStayInside stores trees the decoder accepts but that aim
// at the world outside dest: symlinks to it, link groups named through those
// symlinks, a symlink squatting on the exporter's temporary file name.
func TestHostileTreesStayInside(t *testing.T) {
	out := sentinel(t)
	victim := filepath.Join(out, "victim")
	s := mem.New()
	member := func(name, group, content string) cas.Entry {
		e := fileEntry(t, s, name, content)
		e.LinkGroup, e.Nlink = group, 2
		return e
	}
	cases := []struct {
		name    string
		entries []cas.Entry
		check   func(t *testing.T, dest string)
		class   error
	}{
		{
			name: "link group through a symlink",
			entries: []cas.Entry{
				symlinkEntry("x", out),
				member("y", "x/victim", "tree content"),
				member("z", "x/victim", "tree content"),
			},
			check: func(t *testing.T, dest string) {
				y, z := lstat(t, filepath.Join(dest, "y")), lstat(t, filepath.Join(dest, "z"))
				if y.Ino != z.Ino || y.Nlink != 2 {
					t.Errorf("y and z are not one inode with two links (nlink %d)", y.Nlink)
				}
				if b, _ := os.ReadFile(filepath.Join(dest, "y")); string(b) != "tree content" {
					t.Errorf("y = %q", b)
				}
			},
		},
		{
			name: "lone member naming an outside file",
			entries: []cas.Entry{
				symlinkEntry("x", out),
				member("y", "x/victim", "tree content"),
			},
			check: func(t *testing.T, dest string) {
				if b, _ := os.ReadFile(filepath.Join(dest, "y")); string(b) != "tree content" {
					t.Errorf("y = %q", b)
				}
			},
		},
		{
			name: "symlink on the temporary name",
			entries: []cas.Entry{
				symlinkEntry(".esf-export-1.tmp", victim),
				symlinkEntry(".esf-export-2.tmp", victim),
				fileEntry(t, s, "f", "pwned"),
			},
			check: func(t *testing.T, dest string) {
				if b, _ := os.ReadFile(filepath.Join(dest, "f")); string(b) != "pwned" {
					t.Errorf("f = %q", b)
				}
				if got, _ := os.Readlink(filepath.Join(dest, ".esf-export-1.tmp")); got != victim {
					t.Errorf("symlink replaced: %q", got)
				}
			},
		},
		{
			name: "link group pairs a symlink with a file",
			entries: []cas.Entry{
				func() cas.Entry { e := symlinkEntry("a", victim); e.LinkGroup, e.Nlink = "a", 2; return e }(),
				member("b", "a", "pwned"),
			},
			class: cas.ErrCorrupt,
		},
		{
			name: "hard-linked symlinks to the outside",
			entries: []cas.Entry{
				func() cas.Entry { e := symlinkEntry("a", victim); e.LinkGroup, e.Nlink = "a", 2; return e }(),
				func() cas.Entry { e := symlinkEntry("b", victim); e.LinkGroup, e.Nlink = "a", 2; return e }(),
			},
			check: func(t *testing.T, dest string) {
				a, b := lstat(t, filepath.Join(dest, "a")), lstat(t, filepath.Join(dest, "b"))
				if a.Mode&unix.S_IFMT != unix.S_IFLNK || a.Ino != b.Ino {
					t.Errorf("a, b are not one symlink inode")
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := snapshot(t, out)
			root := putRaw(t, s, &cas.Tree{Attr: cas.Attr{Mode: 0o755}, Entries: c.entries})
			dest := filepath.Join(t.TempDir(), "out")
			_, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true})
			if c.class != nil {
				if !errors.Is(err, c.class) {
					t.Fatalf("err = %v, want %v", err, c.class)
				}
			} else if err != nil {
				t.Fatal(err)
			} else {
				c.check(t, dest)
			}
			checkUntouched(t, out, before)
			// Exporting again into the populated dest is refused before
			// anything is written, symlinks to the outside included.
			if c.class == nil {
				if _, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
					t.Fatalf("second export: err = %v, want ErrFailedPrecondition", err)
				}
				checkUntouched(t, out, before)
			}
		})
	}
}

// TestExporterChecksWithoutDecoder feeds the exporter trees that never went
// through the decoder (as if a reader skipped validation), to prove its own
// defences: it re-checks names, and it creates every node with calls that
// fail on an existing name instead of following it.
func TestExporterChecksWithoutDecoder(t *testing.T) {
	out := sentinel(t)
	victim := filepath.Join(out, "victim")
	s := mem.New()
	trees := map[cas.ID]*cas.Tree{}
	add := func(tr *cas.Tree) cas.ID {
		id := cas.Sum([]byte(fmt.Sprint(len(trees), tr)))
		trees[id] = tr
		return id
	}
	read := func(_ context.Context, _ cas.Getter, id cas.ID) (*dirTree, error) {
		tr, ok := trees[id]
		if !ok {
			return nil, cas.ErrNotFound
		}
		return &dirTree{Attr: tr.Attr, n: len(tr.Entries), entry: func(i int) cas.Entry { return tr.Entries[i] }}, nil
	}
	child := add(&cas.Tree{Attr: cas.Attr{Mode: 0o755}, Entries: []cas.Entry{fileEntry(t, s, "victim", "pwned")}})
	// tarOK: a tar only names things, so duplicate names are the
	// extractor's problem; bad names and types it refuses like ToDir.
	cases := []struct {
		name    string
		entries []cas.Entry
		tarOK   bool
	}{
		{"dotdot dir", []cas.Entry{{Name: "..", Type: cas.TypeDir, ID: child}}, false},
		{"dotdot file", []cas.Entry{fileEntry(t, s, "..", "pwned")}, false},
		{"slash", []cas.Entry{fileEntry(t, s, "sub/../../victim", "pwned")}, false},
		{"absolute", []cas.Entry{fileEntry(t, s, victim, "pwned")}, false},
		{"unknown type", []cas.Entry{{Name: "x", Type: 99}}, false},
		{"mode bits", []cas.Entry{{Name: "x", Type: cas.TypeFIFO, Attr: cas.Attr{Mode: 0o170777}}}, false},
		{"symlink then dir", []cas.Entry{symlinkEntry("x", out), {Name: "x", Type: cas.TypeDir, ID: child}}, true},
		{"symlink then file", []cas.Entry{symlinkEntry("x", victim), fileEntry(t, s, "x", "pwned")}, true},
		{"symlink then symlink", []cas.Entry{symlinkEntry("x", out), symlinkEntry("x", victim)}, true},
		{"symlink then fifo", []cas.Entry{symlinkEntry("x", victim), {Name: "x", Type: cas.TypeFIFO, Attr: cas.Attr{Mode: 0o777}}}, true},
		{"dir then symlink", []cas.Entry{{Name: "x", Type: cas.TypeDir, ID: child}, symlinkEntry("x", out)}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := snapshot(t, out)
			root := add(&cas.Tree{Attr: cas.Attr{Mode: 0o755}, Entries: c.entries})
			dest := filepath.Join(t.TempDir(), "out")
			if _, err := toDir(context.Background(), s, root, dest, Options{PreservePrivileged: true}, read); err == nil {
				t.Fatal("export succeeded")
			}
			_, err := toTar(context.Background(), s, root, io.Discard, Options{PreservePrivileged: true}, read)
			if (err == nil) != c.tarOK {
				t.Fatalf("tar export: err = %v", err)
			}
			checkUntouched(t, out, before)
		})
	}
}

// A destination that is a symlink to the outside is refused, not followed.
func TestDestSymlinkRefused(t *testing.T) {
	out := sentinel(t)
	before := snapshot(t, out)
	s := mem.New()
	root := buildSpecs(t, s, []spec{{path: "victim", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "pwned"}})
	link := filepath.Join(t.TempDir(), "dest")
	if err := os.Symlink(filepath.Join(out, "sub"), link); err != nil {
		t.Fatal(err)
	}
	if _, err := ToDir(context.Background(), s, root, link, Options{PreservePrivileged: true}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("err = %v, want ErrFailedPrecondition", err)
	}
	checkUntouched(t, out, before)
}
