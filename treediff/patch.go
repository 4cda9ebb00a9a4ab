package treediff

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"strconv"
	"strings"

	"github.com/esf-dev/esf/cas"
)

// textLimit is the largest file diffed line by line; larger files, and any
// file holding a NUL byte, go in as binary literals, streamed.
var textLimit int64 = 8 << 20

// contextLines is the unified diff context, git's default.
const contextLines = 3

// Patch writes a git-style patch that turns an export of tree a into an
// export of tree b when applied with `git apply` (plain `patch` cannot take
// binary hunks, symlinks or modes). ZeroID stands for an empty tree.
//
// It carries what git tracks: the content of regular files (text as
// unified hunks with three lines of context, binary as zlib literal hunks
// forward and reverse, so `git apply -R` works too), the executable bit (as
// mode 100644 or 100755), symlinks (mode 120000, the target as content),
// additions, deletions, empty files and type changes (a deletion followed by
// a creation, as git writes them). Index lines hold full git blob ids, which
// git apply checks before applying a binary hunk.
//
// It cannot carry: other permission bits (git writes created and modified
// files 0644 or 0755 under umask 022), owners, mtimes, xattrs, hard links
// (each name is patched as its own file), devices and fifos (left out), and
// directories as such: no empty directory is created, git apply removes a
// directory that a deletion leaves empty, and it cannot replace a directory
// holding anything the patch does not delete (an empty subdirectory, a
// fifo) by a file or symlink.
//
// Where git apply itself refuses a correct patch: it checks every new path
// against the files present before it changes anything, through symlinks
// the patch deletes. So a symlink replaced by a directory fails to apply
// when the new paths, resolved through the old link, exist, loop or cross
// another symlink (a dangling old link is fine); git's own diff of such a
// change fails the same way. Paths with a ".git" component are refused by
// git apply's safety checks.
func Patch(ctx context.Context, g cas.Getter, a, b cas.ID, w io.Writer) error {
	p := &patcher{ctx: ctx, g: g, w: bufio.NewWriterSize(w, 64<<10)}
	if err := DiffWith(ctx, g, a, b, Options{Expand: true}, p.change); err != nil {
		return err
	}
	if err := p.w.Flush(); err != nil {
		return fmt.Errorf("patch: %w", err)
	}
	return nil
}

type patcher struct {
	ctx context.Context
	g   cas.Getter
	w   *bufio.Writer
	buf []byte
}

// gitSide returns e if git can represent it (a file or a symlink).
func gitSide(e *cas.Entry) *cas.Entry {
	if e == nil || (e.Type != cas.TypeFile && e.Type != cas.TypeSymlink) {
		return nil
	}
	return e
}

func gitMode(e *cas.Entry) string {
	switch {
	case e.Type == cas.TypeSymlink:
		return "120000"
	case e.Mode&0o100 != 0:
		return "100755"
	}
	return "100644"
}

func (p *patcher) change(c Change) error {
	if err := p.ctx.Err(); err != nil {
		return err
	}
	old, nw := gitSide(c.Old), gitSide(c.New)
	switch {
	case old == nil && nw == nil:
		return nil
	case old == nil:
		return p.file(c.Path, nil, nw)
	case nw == nil:
		return p.file(c.Path, old, nil)
	case old.Type != nw.Type:
		if err := p.file(c.Path, old, nil); err != nil {
			return err
		}
		return p.file(c.Path, nil, nw)
	case sameContent(old, nw) && gitMode(old) == gitMode(nw):
		// Only what git does not track changed.
		return nil
	}
	return p.file(c.Path, old, nw)
}

// blob is one side of a file section.
type blob struct {
	e      *cas.Entry
	data   []byte // whole content, when small enough to diff as text
	binary bool
	sha    string // git blob id (hex SHA-1)
}

var emptyBlobID = cas.Sum(nil)

const nullSHA = "0000000000000000000000000000000000000000"

// load reads what the section needs of e: the content of small files, the
// git id of all.
func (p *patcher) load(e *cas.Entry) (*blob, error) {
	b := &blob{e: e}
	switch {
	case e.Type == cas.TypeSymlink:
		b.data = []byte(e.Target)
	case e.Size == 0 && e.ID == emptyBlobID:
		b.data = []byte{}
	case e.Size <= textLimit:
		var buf bytes.Buffer
		if err := p.stream(e, &buf); err != nil {
			return nil, err
		}
		b.data = buf.Bytes()
		b.binary = bytes.IndexByte(b.data, 0) >= 0
	default:
		b.binary = true
		h := newGitHasher(e.Size)
		if err := p.stream(e, h); err != nil {
			return nil, err
		}
		b.sha = hex.EncodeToString(h.Sum(nil))
		return b, nil
	}
	h := newGitHasher(int64(len(b.data)))
	h.Write(b.data)
	b.sha = hex.EncodeToString(h.Sum(nil))
	return b, nil
}

func newGitHasher(size int64) hash.Hash {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", size)
	return h
}

// stream copies the content of file e to w, checking it against the entry:
// the Getter's reader ends in ErrCorrupt if the bytes do not match the id,
// and a size that is not the entry's is ErrCorrupt too.
func (p *patcher) stream(e *cas.Entry, w io.Writer) error {
	if e.Size == 0 && e.ID == emptyBlobID {
		return nil
	}
	rc, err := p.g.Get(p.ctx, e.ID)
	if err != nil {
		return fmt.Errorf("patch: blob %s: %w", e.ID.Short(), err)
	}
	defer rc.Close()
	if p.buf == nil {
		p.buf = make([]byte, 256<<10)
	}
	n, err := io.CopyBuffer(w, ctxReader{p.ctx, rc}, p.buf)
	if err != nil {
		return fmt.Errorf("patch: blob %s: %w", e.ID.Short(), err)
	}
	if n != e.Size {
		return fmt.Errorf("patch: blob %s: %d bytes, the entry says %d: %w", e.ID.Short(), n, e.Size, ErrCorrupt)
	}
	return nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// file writes one "diff --git" section: a creation (old nil), a deletion
// (nw nil) or a change of content and/or mode between two entries of one
// type.
func (p *patcher) file(path string, old, nw *cas.Entry) error {
	w := p.w
	fmt.Fprintf(w, "diff --git %s %s\n", quotePath("a/", path), quotePath("b/", path))
	switch {
	case old == nil:
		fmt.Fprintf(w, "new file mode %s\n", gitMode(nw))
	case nw == nil:
		fmt.Fprintf(w, "deleted file mode %s\n", gitMode(old))
	case gitMode(old) != gitMode(nw):
		fmt.Fprintf(w, "old mode %s\nnew mode %s\n", gitMode(old), gitMode(nw))
		if sameContent(old, nw) {
			return nil
		}
	}
	var ob, nb *blob
	var err error
	if old != nil {
		if ob, err = p.load(old); err != nil {
			return err
		}
	}
	if nw != nil {
		if nb, err = p.load(nw); err != nil {
			return err
		}
	}
	osha, nsha := nullSHA, nullSHA
	if ob != nil {
		osha = ob.sha
	}
	if nb != nil {
		nsha = nb.sha
	}
	fmt.Fprintf(w, "index %s..%s", osha, nsha)
	if old != nil && nw != nil && gitMode(old) == gitMode(nw) {
		fmt.Fprintf(w, " %s", gitMode(nw))
	}
	w.WriteString("\n")
	if (ob != nil && ob.binary) || (nb != nil && nb.binary) {
		return p.binary(ob, nb)
	}
	var od, nd []byte
	if ob != nil {
		od = ob.data
	}
	if nb != nil {
		nd = nb.data
	}
	if len(od) == 0 && len(nd) == 0 {
		// An empty file created or deleted: the header says it all.
		return nil
	}
	from, to := "/dev/null", "/dev/null"
	if old != nil {
		from = quotePath("a/", path)
	}
	if nw != nil {
		to = quotePath("b/", path)
	}
	tab := ""
	if strings.Contains(path, " ") {
		// git does the same, so that a name with spaces is not taken for
		// a name followed by a timestamp.
		tab = "\t"
	}
	if old != nil {
		from += tab
	}
	if nw != nil {
		to += tab
	}
	fmt.Fprintf(w, "--- %s\n+++ %s\n", from, to)
	writeHunks(w, splitLines(od), splitLines(nd))
	return nil
}

// writeHunks writes the unified diff of two texts as lines.
func writeHunks(w *bufio.Writer, a, b [][]byte) {
	es := lineEdits(a, b)
	for i := 0; i < len(es); {
		for i < len(es) && es[i].op == ' ' {
			i++
		}
		if i == len(es) {
			return
		}
		start := max(0, i-contextLines)
		// Extend over changes separated by at most 2*context kept lines.
		end, last := i, i
		for end < len(es) {
			if es[end].op != ' ' {
				last = end
			} else if end-last > 2*contextLines {
				break
			}
			end++
		}
		end = min(len(es), last+1+contextLines)
		writeHunk(w, a, b, es[start:end])
		i = end
	}
}

func writeHunk(w *bufio.Writer, a, b [][]byte, es []edit) {
	// Positions: the first line of each side the hunk covers.
	oldStart, newStart := -1, -1
	oldLen, newLen := 0, 0
	for _, e := range es {
		if e.op != '+' {
			if oldStart < 0 {
				oldStart = e.a
			}
			oldLen++
		}
		if e.op != '-' {
			if newStart < 0 {
				newStart = e.b
			}
			newLen++
		}
	}
	fmt.Fprintf(w, "@@ -%s +%s @@\n", hunkRange(oldStart, oldLen), hunkRange(newStart, newLen))
	for _, e := range es {
		var line []byte
		if e.op == '-' {
			line = a[e.a]
		} else {
			line = b[e.b]
		}
		w.WriteByte(e.op)
		w.Write(line)
		if !bytes.HasSuffix(line, []byte("\n")) {
			w.WriteString("\n\\ No newline at end of file\n")
		}
	}
}

// hunkRange is "start,len" with git's conventions: an empty range starts
// at the line before it (0 for an empty file), and ",1" is left out.
func hunkRange(start, n int) string {
	switch {
	case n == 0:
		// Both sides being empty never reaches here; an empty side only
		// happens for a whole-file creation or deletion.
		return "0,0"
	case n == 1:
		return strconv.Itoa(start + 1)
	}
	return strconv.Itoa(start+1) + "," + strconv.Itoa(n)
}

// binary writes a "GIT binary patch": the new content as a literal, then
// the old one as the reverse literal.
func (p *patcher) binary(ob, nb *blob) error {
	p.w.WriteString("GIT binary patch\n")
	if err := p.literal(nb); err != nil {
		return err
	}
	return p.literal(ob)
}

// literal writes one "literal <size>" hunk: the zlib-compressed content in
// git's base85 lines, then an empty line. A missing side is literal 0.
func (p *patcher) literal(b *blob) error {
	size := int64(0)
	if b != nil {
		size = b.e.Size
		if b.e.Type == cas.TypeSymlink {
			size = int64(len(b.data))
		}
	}
	fmt.Fprintf(p.w, "literal %d\n", size)
	lw := &base85Lines{w: p.w}
	zw := zlib.NewWriter(lw)
	var err error
	switch {
	case b == nil:
	case b.data != nil:
		_, err = zw.Write(b.data)
	default:
		err = p.stream(b.e, zw)
	}
	if err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("patch: %w", err)
	}
	lw.flush()
	p.w.WriteString("\n")
	return nil
}

// base85Lines writes bytes as git's binary patch lines: up to 52 bytes a
// line, prefixed by their count ('A'-'Z' for 1-26, 'a'-'z' for 27-52) and
// encoded four bytes to five characters.
type base85Lines struct {
	w   *bufio.Writer
	buf [52]byte
	n   int
}

const base85Alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"

func (l *base85Lines) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		c := copy(l.buf[l.n:], p)
		l.n += c
		p = p[c:]
		if l.n == len(l.buf) {
			l.flush()
		}
	}
	return total, nil
}

func (l *base85Lines) flush() {
	if l.n == 0 {
		return
	}
	if l.n <= 26 {
		l.w.WriteByte(byte('A' + l.n - 1))
	} else {
		l.w.WriteByte(byte('a' + l.n - 27))
	}
	var out [5]byte
	for i := 0; i < l.n; i += 4 {
		var acc uint32
		for j := 0; j < 4; j++ {
			acc <<= 8
			if i+j < l.n {
				acc |= uint32(l.buf[i+j])
			}
		}
		for j := 4; j >= 0; j-- {
			out[j] = base85Alphabet[acc%85]
			acc /= 85
		}
		l.w.Write(out[:])
	}
	l.w.WriteByte('\n')
	l.n = 0
}

// quotePath writes prefix+p as git does: verbatim, or C-quoted when it holds
// a quote, a backslash, a control character or a byte above 0x7e
// (core.quotePath's default).
func quotePath(prefix, p string) string {
	s := prefix + p
	needs := false
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' || c < 0x20 || c >= 0x7f {
			needs = true
			break
		}
	}
	if !needs {
		return s
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\a':
			b.WriteString(`\a`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\v':
			b.WriteString(`\v`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if c < 0x20 || c >= 0x7f {
				fmt.Fprintf(&b, `\%03o`, c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
