package export

import (
	"archive/tar"
	"path"
	"strconv"
)

// Fast tar headers. archive/tar's WriteHeader costs more than reading and
// hashing a small file: it checks every field against three formats into a
// fresh map, sorts it, builds the PAX record and its header's name with
// several allocations, and formats each number through strings. For the
// headers nearly every export writes (a file, directory, symlink, hard link
// or fifo with an ASCII name and link target of at most 100 bytes, ids and
// size that fit USTAR's octal fields, an mtime from 1970 on, no xattrs)
// appendHeader writes the same bytes itself: the PAX header with the one
// "mtime" record when the mtime has nanoseconds, then the USTAR-compatible
// block archive/tar writes for FormatPAX. Every other header goes through
// archive/tar. TestAppendHeaderMatchesArchiveTar holds the two to the same
// bytes.

const blockSize = 512

// Offsets and sizes of the fields of a POSIX (USTAR) header block.
const (
	offName, lenName         = 0, 100
	offMode, lenMode         = 100, 8
	offUID, lenUID           = 108, 8
	offGID, lenGID           = 116, 8
	offSize, lenSize         = 124, 12
	offMtime, lenMtime       = 136, 12
	offChksum, lenChksum     = 148, 8
	offType                  = 156
	offLink, lenLink         = 157, 100
	offMagic                 = 257 // "ustar\x00" then version "00"
	offDevMajor, lenDevMajor = 329, 8
	offDevMinor, lenDevMinor = 337, 8
)

// fastHeader reports whether appendHeader can write h.
func fastHeader(h *tar.Header) bool {
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	default:
		return false
	}
	secs := h.ModTime.Unix()
	return h.Format == tar.FormatPAX && len(h.PAXRecords) == 0 && len(h.Xattrs) == 0 &&
		h.Uname == "" && h.Gname == "" && h.Devmajor == 0 && h.Devminor == 0 &&
		h.AccessTime.IsZero() && h.ChangeTime.IsZero() &&
		plainString(h.Name, lenName) && plainString(h.Linkname, lenLink) &&
		fitsOctal(lenMode, h.Mode) && fitsOctal(lenUID, int64(h.Uid)) && fitsOctal(lenGID, int64(h.Gid)) &&
		fitsOctal(lenSize, h.Size) && fitsOctal(lenMtime, secs) &&
		// archive/tar refuses these with a trailing slash.
		(h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeFifo || h.Name == "" || h.Name[len(h.Name)-1] != '/')
}

// plainString reports whether s fits a header field of n bytes as it is:
// ASCII without NUL, at most n bytes.
func plainString(s string, n int) bool {
	if len(s) > n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == 0 || c >= 0x80 {
			return false
		}
	}
	return true
}

// fitsOctal reports whether x fits a NUL-terminated octal field of n bytes.
func fitsOctal(n int, x int64) bool {
	return x >= 0 && (n >= 22 || x < 1<<(uint(n-1)*3))
}

// appendHeader appends the header blocks of h, for which fastHeader holds,
// to dst: those archive/tar's WriteHeader writes for it.
func appendHeader(dst []byte, h *tar.Header) []byte {
	secs, nsecs := h.ModTime.Unix(), h.ModTime.Nanosecond()
	if nsecs != 0 {
		// One record, "<len> mtime=<secs>.<nanoseconds without trailing
		// zeros>\n", where len counts the whole record, itself included.
		var val [32]byte
		v := strconv.AppendInt(val[:0], secs, 10)
		v = append(v, '.')
		ns := strconv.AppendInt(nil, int64(nsecs)+1e9, 10)[1:] // nine digits
		for len(ns) > 0 && ns[len(ns)-1] == '0' {
			ns = ns[:len(ns)-1]
		}
		v = append(v, ns...)
		const key = "mtime"
		size := len(key) + len(v) + 3
		size += len(strconv.Itoa(size))
		if len(strconv.Itoa(size))+len(key)+len(v)+3 != size {
			size = len(strconv.Itoa(size)) + len(key) + len(v) + 3
		}
		dir, file := path.Split(h.Name)
		name := path.Join(dir, "PaxHeaders.0", file)
		if len(name) > lenName {
			name = name[:lenName]
		}
		for len(name) > 0 && name[len(name)-1] == '/' {
			name = name[:len(name)-1]
		}
		var blk [blockSize]byte
		copy(blk[offName:offName+lenName], name)
		putOctal(blk[offMode:offMode+lenMode], 0)
		putOctal(blk[offUID:offUID+lenUID], 0)
		putOctal(blk[offGID:offGID+lenGID], 0)
		putOctal(blk[offSize:offSize+lenSize], int64(size))
		putOctal(blk[offMtime:offMtime+lenMtime], 0)
		blk[offType] = tar.TypeXHeader
		finishBlock(&blk)
		dst = append(dst, blk[:]...)
		start := len(dst)
		dst = strconv.AppendInt(dst, int64(size), 10)
		dst = append(dst, ' ')
		dst = append(dst, key...)
		dst = append(dst, '=')
		dst = append(dst, v...)
		dst = append(dst, '\n')
		dst = append(dst, zeroBlock[:padding(int64(len(dst)-start))]...)
	}
	var blk [blockSize]byte
	copy(blk[offName:offName+lenName], h.Name)
	copy(blk[offLink:offLink+lenLink], h.Linkname)
	putOctal(blk[offMode:offMode+lenMode], h.Mode)
	putOctal(blk[offUID:offUID+lenUID], int64(h.Uid))
	putOctal(blk[offGID:offGID+lenGID], int64(h.Gid))
	putOctal(blk[offSize:offSize+lenSize], h.Size)
	putOctal(blk[offMtime:offMtime+lenMtime], secs)
	blk[offType] = h.Typeflag
	putOctal(blk[offDevMajor:offDevMajor+lenDevMajor], 0)
	putOctal(blk[offDevMinor:offDevMinor+lenDevMinor], 0)
	finishBlock(&blk)
	return append(dst, blk[:]...)
}

var zeroBlock [blockSize]byte

// padding is how many zero bytes follow n bytes of a member's data.
func padding(n int64) int64 { return -n & (blockSize - 1) }

// putOctal writes x to field b in octal with leading zeros and a closing
// NUL, as archive/tar does; x fits (fitsOctal).
func putOctal(b []byte, x int64) {
	i := len(b) - 1
	b[i] = 0
	for i > 0 {
		i--
		b[i] = byte('0' + x&7)
		x >>= 3
	}
}

// finishBlock sets the USTAR magic and version and the checksum: the sum of
// the block's bytes with the checksum field counted as spaces, in six octal
// digits, a NUL and a space.
func finishBlock(b *[blockSize]byte) {
	copy(b[offMagic:], "ustar\x0000")
	var sum int64
	for i, c := range b {
		if i >= offChksum && i < offChksum+lenChksum {
			c = ' '
		}
		sum += int64(c)
	}
	putOctal(b[offChksum:offChksum+lenChksum-1], sum)
	b[offChksum+lenChksum-1] = ' '
}
