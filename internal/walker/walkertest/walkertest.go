// Package walkertest builds the walker program (internal/walker) and reads
// what it prints, for FR-07: the Linux binary under runc, the wasip1
// module under wazero and the tree in the CAS must list the same root
// identically.
//
// A test builds both binaries (once per test process, with the go
// command), runs each on the same attempt root with Args, parses the
// outputs with Parse and compares them with FromTree's rendering of the
// node's root id:
//
//	want, _ := walkertest.FromTree(ctx, store, rootID, walkertest.Options{})
//	linux := walkertest.Build(t, "linux")    // bind-mount it, e.g. at /.esf/walker
//	wasm := walkertest.Wasm(t)               // wasi.Spec{Module: wasm, Args: ...}
//	args := walkertest.Args("/", false, walkertest.DefaultSkip) // append to argv[0]
//	got, _ := walkertest.Parse(stdout)
//	if d := walkertest.Diff(want, got); d != "" { t.Error(d) }
//	// the wasip1 run, and -portable runs, compare with Portable(want)
package walkertest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/wasi/wasitest"
)

// Pkg is the walker's import path.
const Pkg = "github.com/esf-dev/esf/internal/walker"

// DefaultSkip is the walker's default -skip: what runc mounts over the
// root and WASI never sees, and esf's own mount point.
var DefaultSkip = []string{"/proc", "/sys", "/dev", "/.esf"}

// Build builds the walker for goos ("linux": static, cgo off, the host's
// architecture; "wasip1": a WebAssembly module) and writes it, mode 0755,
// into a fresh t.TempDir; it returns the file's path. The build itself
// runs once per test process.
func Build(tb testing.TB, goos string) string {
	tb.Helper()
	name := "walker"
	if goos == "wasip1" {
		name = "walker.wasm"
	}
	return wasitest.WriteExecutable(tb, wasitest.GoBuild(tb, Pkg, goos, ""), name)
}

// Wasm returns the walker's wasip1 module, for wasi.Spec.Module.
func Wasm(tb testing.TB) []byte {
	tb.Helper()
	return wasitest.GoBuild(tb, Pkg, "wasip1", "")
}

// Args returns the walker's arguments (without argv[0]) to list root,
// leaving out skip, with -portable if asked.
func Args(root string, portable bool, skip []string) []string {
	args := []string{"-skip", strings.Join(skip, ",")}
	if portable {
		args = append(args, "-portable")
	}
	return append(args, root)
}

// Line is one path as the walker prints it.
type Line struct {
	Path   string // relative to the walked root, leading slash; "/" is the root
	Type   string // file, dir, symlink, chardev, blockdev, fifo, socket, other
	Size   int64  // file bytes or symlink target length; -1 for other types
	Mode   int32  // permission bits with setuid/setgid/sticky; -1 if not printed
	Target string // symlink target
	Hash   string // hex digest of a file's content; "" for other types
}

func (l Line) String() string {
	size, mode, target, sum := "-", "-", "-", "-"
	if l.Size >= 0 {
		size = strconv.FormatInt(l.Size, 10)
	}
	if l.Mode >= 0 {
		mode = fmt.Sprintf("%04o", l.Mode)
	}
	if l.Type == "symlink" {
		target = strconv.Quote(l.Target)
	}
	if l.Hash != "" {
		sum = l.Hash
	}
	return strings.Join([]string{strconv.Quote(l.Path), l.Type, size, mode, target, sum}, "\t")
}

// Format prints lines as the walker does.
func Format(lines []Line) []byte {
	var b bytes.Buffer
	for _, l := range lines {
		b.WriteString(l.String())
		b.WriteByte('\n')
	}
	return b.Bytes()
}

var types = []string{"file", "dir", "symlink", "chardev", "blockdev", "fifo", "socket", "other"}

// Parse reads the walker's output. It accepts exactly what the walker
// prints: any other line, or lines out of order, are an error.
func Parse(out []byte) ([]Line, error) {
	var lines []Line
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		l, err := parseLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("walker output line %d: %w", n, err)
		}
		if len(lines) > 0 && lines[len(lines)-1].Path >= l.Path {
			return nil, fmt.Errorf("walker output line %d: %q is out of order", n, l.Path)
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) > 0 && out[len(out)-1] != '\n' {
		return nil, fmt.Errorf("walker output: last line not terminated")
	}
	return lines, nil
}

func parseLine(s string) (Line, error) {
	f := strings.Split(s, "\t")
	if len(f) != 6 {
		return Line{}, fmt.Errorf("%d fields, want 6: %q", len(f), s)
	}
	var l Line
	var err error
	if l.Path, err = strconv.Unquote(f[0]); err != nil || !path.IsAbs(l.Path) || strconv.Quote(l.Path) != f[0] {
		return Line{}, fmt.Errorf("bad path %q", f[0])
	}
	if l.Type = f[1]; !slices.Contains(types, l.Type) {
		return Line{}, fmt.Errorf("bad type %q", f[1])
	}
	hasSize := l.Type == "file" || l.Type == "symlink"
	switch {
	case f[2] == "-" && !hasSize:
		l.Size = -1
	case f[2] != "-" && hasSize:
		if l.Size, err = strconv.ParseInt(f[2], 10, 64); err != nil || l.Size < 0 || strconv.FormatInt(l.Size, 10) != f[2] {
			return Line{}, fmt.Errorf("bad size %q", f[2])
		}
	default:
		return Line{}, fmt.Errorf("size %q for a %s", f[2], l.Type)
	}
	if f[3] == "-" {
		l.Mode = -1
	} else {
		m, err := strconv.ParseUint(f[3], 8, 32)
		if err != nil || m > 0o7777 || l.Type == "symlink" || fmt.Sprintf("%04o", m) != f[3] {
			return Line{}, fmt.Errorf("bad mode %q for a %s", f[3], l.Type)
		}
		l.Mode = int32(m)
	}
	if l.Type == "symlink" {
		if l.Target, err = strconv.Unquote(f[4]); err != nil || strconv.Quote(l.Target) != f[4] || int64(len(l.Target)) != l.Size {
			return Line{}, fmt.Errorf("bad target %q", f[4])
		}
	} else if f[4] != "-" {
		return Line{}, fmt.Errorf("target %q for a %s", f[4], l.Type)
	}
	if l.Type == "file" {
		if b, err := hex.DecodeString(f[5]); err != nil || len(b) != 32 || hex.EncodeToString(b) != f[5] {
			return Line{}, fmt.Errorf("bad hash %q", f[5])
		}
		l.Hash = f[5]
	} else if f[5] != "-" {
		return Line{}, fmt.Errorf("hash %q for a %s", f[5], l.Type)
	}
	return l, nil
}

// Portable returns what a -portable (or wasip1) walker prints for the same
// files: no modes, and fifo and socket as "other".
func Portable(lines []Line) []Line {
	out := slices.Clone(lines)
	for i := range out {
		out[i].Mode = -1
		if out[i].Type == "fifo" || out[i].Type == "socket" {
			out[i].Type = "other"
		}
	}
	return out
}

// Options tune FromTree.
type Options struct {
	// Skip leaves these paths out, as the walker's -skip does; nil means
	// DefaultSkip, an empty non-nil slice nothing.
	Skip []string
	// SHA256 hashes file content with SHA-256 (reading every blob), as
	// walker -hash sha256 does; by default the hash is the BLAKE3 blob id.
	SHA256 bool
}

// FromTree renders the tree root in g as the walker would print it after
// walking a checkout of it. Directory modes come from each directory's own
// tree; symlinks have no mode.
func FromTree(ctx context.Context, g cas.Getter, root cas.ID, opts Options) ([]Line, error) {
	skip := opts.Skip
	if skip == nil {
		skip = DefaultSkip
	}
	skipped := func(p string) bool {
		for _, s := range skip {
			s = path.Clean("/" + s)
			if p == s || strings.HasPrefix(p, s+"/") || s == "/" {
				return true
			}
		}
		return false
	}
	var lines []Line
	var walk func(id cas.ID, p string) error
	walk = func(id cas.ID, p string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		t, err := cas.ReadTree(ctx, g, id)
		if err != nil {
			return fmt.Errorf("tree %s at %s: %w", id.Short(), p, err)
		}
		lines = append(lines, Line{Path: p, Type: "dir", Size: -1, Mode: int32(t.Mode & cas.ModeMask)})
		for i := range t.Entries {
			e := &t.Entries[i]
			ep := path.Join(p, e.Name)
			if skipped(ep) {
				continue
			}
			if e.Type == cas.TypeDir {
				if err := walk(e.ID, ep); err != nil {
					return err
				}
				continue
			}
			l := Line{Path: ep, Type: e.Type.String(), Size: -1, Mode: int32(e.Mode & cas.ModeMask)}
			switch e.Type {
			case cas.TypeFile:
				l.Size, l.Hash = e.Size, e.ID.String()
				if opts.SHA256 {
					if l.Hash, err = sha256Of(ctx, g, e.ID); err != nil {
						return fmt.Errorf("%s: %w", ep, err)
					}
				}
			case cas.TypeSymlink:
				l.Size, l.Target, l.Mode = int64(len(e.Target)), e.Target, -1
			}
			lines = append(lines, l)
		}
		return nil
	}
	if !skipped("/") {
		if err := walk(root, "/"); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(lines, func(a, b Line) int { return strings.Compare(a.Path, b.Path) })
	return lines, nil
}

func sha256Of(ctx context.Context, g cas.Getter, id cas.ID) (string, error) {
	rc, err := g.Get(ctx, id)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Diff describes how got differs from want, or returns "" if they are
// equal. It names at most 20 differences.
func Diff(want, got []Line) string {
	var b strings.Builder
	n := 0
	note := func(format string, args ...any) {
		if n < 20 {
			fmt.Fprintf(&b, format+"\n", args...)
		}
		n++
	}
	i, j := 0, 0
	for i < len(want) || j < len(got) {
		switch {
		case j == len(got) || (i < len(want) && want[i].Path < got[j].Path):
			note("missing: %s", want[i])
			i++
		case i == len(want) || got[j].Path < want[i].Path:
			note("extra:   %s", got[j])
			j++
		default:
			if want[i] != got[j] {
				note("want:    %s\ngot:     %s", want[i], got[j])
			}
			i++
			j++
		}
	}
	if n > 20 {
		fmt.Fprintf(&b, "... and %d more\n", n-20)
	}
	return b.String()
}
