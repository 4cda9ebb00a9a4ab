//go:build linux

package local

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// The redo log makes the objects of a small batch (a seal of a few changed
// files: a blob or two and the trees above them) durable with one
// fdatasync of one preallocated file, instead of a syncfs(2) that writes
// back every dirty page of the file system (other tenants' too) or one
// fsync per file, each a flush of the device's cache.
//
// Layout of <dir>/redo.log, redoSize bytes written once at Open (so an
// append rewrites allocated blocks and fdatasync has no metadata to
// write): a header block (magic, generation) and, from redoHeader on,
// records: magic, generation, length, id, then the object's bytes. A
// record is valid if its magic and generation are the header's and its
// bytes hash to its id, so a torn or stale record ends the scan by itself.
//
// Protocol (batch Commit with every object small and in memory): append
// the batch's records and fdatasync the log; only then create the fan-out
// directories and link the temp files into objects/, none of it flushed.
// Open, before anything reads the store, replays the log: every object a
// valid record names that is missing or does not hash to its id (a crash
// lost its link, its directory or its unflushed data) is written again
// with Put, which makes it durable. When the log is full, a syncfs makes
// every linked object durable and the log starts over under the next
// generation (header rewritten and flushed), which also retires the
// batches' redo names (see NewBatch).
const (
	redoName    = "redo.log"
	redoSize    = 4 << 20
	redoHeader  = 4096
	redoRecHead = 4 + 8 + 4 + cas.IDSize
	redoMagic   = 0x45535231 // "ESR1"
	// A batch is logged only if it is at most this big: the log is for
	// the latency of small commits, bulk goes through syncfs.
	redoMaxObjects = 64
	redoMaxBytes   = 1 << 20
)

type redoLog struct {
	s   *Store
	mu  sync.Mutex
	f   *os.File
	gen uint64
	off int64
	// syncfs is unix.Syncfs; a seam for tests.
	syncfs func(fd int) error
}

type redoObject struct {
	id   cas.ID
	data []byte
}

// openRedoLog replays the log of dir's store into s, if any, then starts
// a fresh generation. Only the store's writer calls it.
func openRedoLog(s *Store) (*redoLog, error) {
	p := filepath.Join(s.dir, redoName)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	l := &redoLog{s: s, f: f, syncfs: unix.Syncfs}
	fail := func(err error) (*redoLog, error) {
		f.Close()
		return nil, fmt.Errorf("redo log %s: %w", p, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	if fi.Size() > 0 {
		gen, err := l.replay()
		if err != nil {
			return fail(err)
		}
		l.gen = gen
	}
	if fi.Size() < redoSize {
		if _, err := f.WriteAt(make([]byte, redoSize-fi.Size()), fi.Size()); err != nil {
			return fail(err)
		}
		if err := f.Sync(); err != nil {
			return fail(err)
		}
		if err := syncDir(s.dir); err != nil {
			return fail(err)
		}
	}
	if err := l.restart(); err != nil {
		return fail(err)
	}
	return l, nil
}

// replay writes again every object a valid record of the current
// generation names that the store lacks or holds damaged, and returns the
// generation.
func (l *redoLog) replay() (uint64, error) {
	var hdr [16]byte
	if _, err := l.f.ReadAt(hdr[:], 0); err != nil {
		return 0, nil // no header: nothing was ever logged
	}
	if binary.LittleEndian.Uint64(hdr[:8]) != redoMagic {
		return 0, nil
	}
	gen := binary.LittleEndian.Uint64(hdr[8:])
	off := int64(redoHeader)
	head := make([]byte, redoRecHead)
	for {
		if _, err := l.f.ReadAt(head, off); err != nil {
			break
		}
		n := int64(binary.LittleEndian.Uint32(head[12:16]))
		if binary.LittleEndian.Uint32(head[:4]) != redoMagic || binary.LittleEndian.Uint64(head[4:12]) != gen ||
			n > redoMaxBytes || off+redoRecHead+n > redoSize {
			break
		}
		var id cas.ID
		copy(id[:], head[16:])
		data := make([]byte, n)
		if _, err := l.f.ReadAt(data, off+redoRecHead); err != nil || cas.Sum(data) != id {
			break
		}
		if err := l.s.redo(id, data); err != nil {
			return 0, err
		}
		off += redoRecHead + n
	}
	return gen, nil
}

// redo makes object id, whose bytes are data, stored, whole and durable.
func (s *Store) redo(id cas.ID, data []byte) error {
	whole, err := hashesTo(s.Path(id), id)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if whole {
		// Whole as read, but perhaps only in the page cache (the process
		// died, the machine did not): its data is flushed before its
		// record can be dropped. Its link may still be unflushed too: Open
		// fsynced the fan-out directories, but a directory itself may be
		// new.
		if err := syncFile(s.Path(id)); err != nil {
			return err
		}
		s.fanout[id[0]].Store(false)
		return s.ensureFanout(id, syncDir)
	}
	// Counted as a removal (see Deletions), though the object is written
	// again at once: in between it is missing.
	if err := s.removeObject(id); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	s.fanout[id[0]].Store(false) // made again, durably, by Put
	_, _, err = s.Put(context.Background(), bytes.NewReader(data))
	return err
}

// Redo makes object id, whose bytes are data, stored, whole and durable:
// the replay of a redo record kept outside the store (a cas.Deferral's,
// in the journal). A stored object that does not hash to id is written
// again. data must hash to id (ErrCorrupt otherwise: a damaged record).
func (s *Store) Redo(id cas.ID, data []byte) error {
	if cas.Sum(data) != id {
		return fmt.Errorf("redo %s: the record's bytes hash to %s: %w", id, cas.Sum(data), cas.ErrCorrupt)
	}
	if err := s.redo(id, data); err != nil {
		return fmt.Errorf("redo %s: %w", id, err)
	}
	return nil
}

// Sync makes every object published so far durable with one syncfs(2) of
// the store's file system, and retires the batches' redo names it covers.
// After it returns nil, the redo records kept outside the store (a
// cas.Deferral's) of every object published before the call may go.
func (s *Store) Sync() error {
	fd, err := unix.Open(s.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync %s: %w", s.dir, err)
	}
	defer unix.Close(fd)
	retire := s.takeRetired()
	if err := unix.Syncfs(fd); err != nil {
		s.addRetired(retire)
		return fmt.Errorf("sync %s: syncfs: %w", s.dir, err)
	}
	removeRetired(retire)
	return nil
}

// restart begins the next generation: an empty log. l.mu is held or l is
// not shared yet.
func (l *redoLog) restart() error {
	var hdr [16]byte
	binary.LittleEndian.PutUint64(hdr[:8], redoMagic)
	binary.LittleEndian.PutUint64(hdr[8:], l.gen+1)
	if _, err := l.f.WriteAt(hdr[:], 0); err != nil {
		return err
	}
	if err := unix.Fdatasync(int(l.f.Fd())); err != nil {
		return err
	}
	l.gen++
	l.off = redoHeader
	return nil
}

// append makes objs durable in the log: records written, then one
// fdatasync. A full log is first emptied: a syncfs makes every object
// linked so far durable (and retires the batches' redo names), then the
// next generation starts.
func (l *redoLog) append(objs []redoObject) error {
	size := int64(0)
	for _, o := range objs {
		size += redoRecHead + int64(len(o.data))
	}
	buf := make([]byte, 0, size)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.off+size > redoSize {
		s := l.s
		retire := s.takeRetired()
		if err := l.syncfs(int(l.f.Fd())); err != nil {
			s.addRetired(retire)
			return fmt.Errorf("redo log: syncfs %s: %w", s.dir, err)
		}
		removeRetired(retire)
		if err := l.restart(); err != nil {
			return fmt.Errorf("redo log: %w", err)
		}
	}
	for _, o := range objs {
		buf = binary.LittleEndian.AppendUint32(buf, redoMagic)
		buf = binary.LittleEndian.AppendUint64(buf, l.gen)
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(o.data)))
		buf = append(buf, o.id[:]...)
		buf = append(buf, o.data...)
	}
	if _, err := l.f.WriteAt(buf, l.off); err != nil {
		return fmt.Errorf("redo log: %w", err)
	}
	// The records count only once flushed; the offset moves on even if
	// the flush fails (what it left is never relied on).
	l.off += size
	if err := unix.Fdatasync(int(l.f.Fd())); err != nil {
		return fmt.Errorf("redo log: fdatasync: %w", err)
	}
	return nil
}

func (l *redoLog) close() error {
	if l == nil {
		return nil
	}
	return l.f.Close()
}
