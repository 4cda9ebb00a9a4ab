package crashtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// writeFixture makes the small tree every case's group is imported from:
// nested dirs, an empty file, a symlink, a hard link, an executable and a
// user xattr: enough for a seal to have every kind of change to make.
func writeFixture(dir string) error {
	rng := rand.New(rand.NewPCG(3, 1))
	blob := make([]byte, 96<<10)
	for i := range blob {
		blob[i] = byte(rng.Uint32())
	}
	files := map[string][]byte{
		"a.txt":              []byte("alpha\n"),
		"dir/b.txt":          bytes.Repeat([]byte("bravo\n"), 100),
		"dir/sub/c.bin":      blob,
		"dir/sub/run.sh":     []byte("#!/bin/sh\necho ok\n"),
		"empty":              nil,
		"keep/untouched.txt": []byte("never changed\n"),
	}
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	return firstErr(
		os.Chmod(filepath.Join(dir, "dir/sub/run.sh"), 0o755),
		os.Symlink("dir/b.txt", filepath.Join(dir, "link")),
		os.Link(filepath.Join(dir, "a.txt"), filepath.Join(dir, "keep/a-hardlink.txt")),
		unix.Setxattr(filepath.Join(dir, "dir/b.txt"), "user.esf.test", []byte("fixture"), 0),
	)
}

// writeChanges makes, in an attempt's root, one change of each kind a seal
// must capture: new, modified, deleted and renamed files, a replaced
// directory (rm -rf d && mkdir d), chmod only, a retargeted symlink, a new
// hard link and an xattr. tag makes the content differ between cases.
func writeChanges(root, tag string) error { return writeChangesOf(root, tag, false) }

// writeSmallChanges makes every change of writeChanges but the large file:
// a seal whose new objects all fit one small batch (at most
// cas.DeferMaxObjects objects and cas.DeferMaxBytes bytes), which rides
// in the seal's journal commit (fabric/storeredo.go).
func writeSmallChanges(root, tag string) error { return writeChangesOf(root, tag, true) }

func writeChangesOf(root, tag string, small bool) error {
	p := func(name string) string { return filepath.Join(root, name) }
	steps := []func() error{
		func() error { return os.WriteFile(p("new.txt"), []byte("new in "+tag+"\n"), 0o640) },
		func() error {
			// Copy-up breaks a.txt's hard link with keep/a-hardlink.txt
			// (overlay with index=off): the seal must split the group.
			return os.WriteFile(p("a.txt"), []byte("alpha modified in "+tag+"\n"), 0o644)
		},
		func() error { return os.Remove(p("dir/b.txt")) },
		func() error { return os.Rename(p("empty"), p("renamed-empty")) },
		func() error { return os.RemoveAll(p("dir/sub")) },
		func() error { return os.Mkdir(p("dir/sub"), 0o750) },
		func() error { return os.WriteFile(p("dir/sub/fresh.bin"), bytes.Repeat([]byte(tag), 4096), 0o600) },
		func() error { return os.Chmod(p("keep/untouched.txt"), 0o600) },
		func() error { return os.Remove(p("link")) },
		func() error { return os.Symlink("new.txt", p("link")) },
		func() error { return os.Link(p("new.txt"), p("new-hardlink.txt")) },
		func() error { return unix.Setxattr(p("new.txt"), "user.esf.tag", []byte(tag), 0) },
		func() error {
			// Over 1 MiB: a seal that releases the attempt hands it to the
			// store instead of copying it (cas.Adopter); one that does not
			// commit must give the delta its own file back.
			return os.WriteFile(p("dir/large.bin"), bytes.Repeat([]byte(tag+"\n"), 3<<20/(len(tag)+1)), 0o640)
		},
	}
	if small {
		steps = steps[:len(steps)-1]
	}
	for i, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("change %d in %s: %w", i, root, err)
		}
	}
	return nil
}

// manifest describes a tree as the seal must preserve it: per path its
// type, permission bits, owner, content digest, link target and user
// xattrs. Directory and file times are left out: export sets them from the
// tree, and what the acceptance asks is bytes, types, modes and targets.
func manifest(root string) (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("%s %04o %d:%d", typeName(st.Mode), st.Mode&0o7777, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			// No link count: overlayfs reports the lower file's count for
			// a member whose partner was copied up.
			desc += fmt.Sprintf(" %d %s", len(b), hex.EncodeToString(sum[:8]))
		case unix.S_IFLNK:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		if x := userXattrs(path); x != "" {
			desc += " " + x
		}
		out[rel] = desc
		return nil
	})
	return out, err
}

func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFREG:
		return "file"
	case unix.S_IFLNK:
		return "symlink"
	}
	return fmt.Sprintf("type%o", mode&unix.S_IFMT)
}

// userXattrs renders the user.* xattrs of path (not following symlinks).
func userXattrs(path string) string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(path, buf)
	if err != nil || n == 0 {
		return ""
	}
	var names []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if strings.HasPrefix(name, "user.") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var parts []string
	for _, name := range names {
		v := make([]byte, 4096)
		m, err := unix.Lgetxattr(path, name, v)
		if err != nil {
			continue
		}
		parts = append(parts, name+"="+string(v[:m]))
	}
	return strings.Join(parts, ",")
}

// diffManifests describes how got differs from want ("" if equal).
func diffManifests(want, got map[string]string) string {
	var lines []string
	for p, w := range want {
		if g, ok := got[p]; !ok {
			lines = append(lines, fmt.Sprintf("  missing %s (%s)", p, w))
		} else if g != w {
			lines = append(lines, fmt.Sprintf("  %s: %s, want %s", p, g, w))
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			lines = append(lines, fmt.Sprintf("  extra %s (%s)", p, g))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
