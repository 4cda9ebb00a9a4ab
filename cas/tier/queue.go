package tier

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/esf-dev/esf/cas"
	s3store "github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/internal/atomicfile"
)

// Async durability (Options.QueueDir): a write is acknowledged once it is
// committed locally and its objects are recorded in the upload queue, a
// directory of files that each list the ids of one write, one hex id per
// line. A queue file is written to a temp name, fsynced, renamed into place
// and the directory fsynced before the write returns, so an acknowledged
// write's objects are either in the remote or named by a durable queue file,
// across crashes. An uploader goroutine drains the files oldest first:
// it uploads each file's objects from the cache (packed like any batch) and
// removes the file only after the upload succeeded; a failure is retried
// with backoff (1 s doubling to 30 s). A restarted tier finds the files left
// and uploads them. Objects named by the queue are not in the remote yet,
// so eviction keeps them (it asks the remote first). An object gone from
// the cache (collected as garbage before its upload) is skipped.

const (
	queueMinBackoff = time.Second
	queueMaxBackoff = 30 * time.Second
)

type queue struct {
	dir    string
	wake   chan struct{}
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu      sync.Mutex
	seq     uint64
	pending map[string]int // file name -> ids in it
	lastErr error
}

// QueueStatus describes the upload queue.
type QueueStatus struct {
	// Files and Objects are the writes and the object ids waiting.
	Files, Objects int
	// LastError is the last upload failure, "" after a success.
	LastError string
}

func openQueue(dir string) (*queue, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	q := &queue{dir: dir, wake: make(chan struct{}, 1), pending: map[string]int{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			// An atomicfile temporary (or an older ".tmp-" one): its
			// add never returned, so nothing was acknowledged.
			os.Remove(filepath.Join(dir, name))
			continue
		}
		ids, err := q.read(name)
		if err != nil {
			return nil, err
		}
		q.pending[name] = len(ids)
	}
	return q, nil
}

func (q *queue) read(name string) ([]cas.ID, error) {
	b, err := os.ReadFile(filepath.Join(q.dir, name))
	if err != nil {
		return nil, fmt.Errorf("upload queue: %w", err)
	}
	var ids []cas.ID
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		id, err := cas.ParseID(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("upload queue %s: %w", name, err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// add records ids durably.
func (q *queue) add(ids []cas.ID) error {
	if len(ids) == 0 {
		return nil
	}
	var b bytes.Buffer
	for _, id := range ids {
		b.WriteString(id.String())
		b.WriteByte('\n')
	}
	q.mu.Lock()
	q.seq++
	// Sortable by time, unique within the process by seq, across
	// processes by pid.
	name := fmt.Sprintf("%020d-%d-%d", time.Now().UnixNano(), os.Getpid(), q.seq)
	q.mu.Unlock()
	if err := atomicfile.WriteFile(filepath.Join(q.dir, name), b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("upload queue: %w", err)
	}
	q.mu.Lock()
	q.pending[name] = len(ids)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return nil
}

func (q *queue) status() QueueStatus {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := QueueStatus{Files: len(q.pending)}
	for _, n := range q.pending {
		st.Objects += n
	}
	if q.lastErr != nil {
		st.LastError = q.lastErr.Error()
	}
	return st
}

// QueueStatus reports the upload queue (zero without async durability).
func (t *Store) QueueStatus() QueueStatus {
	if t.queue == nil {
		return QueueStatus{}
	}
	return t.queue.status()
}

// startUploader runs the queue's uploader until Close.
func (t *Store) startUploader() {
	ctx, cancel := context.WithCancel(context.Background())
	t.queue.cancel = cancel
	t.queue.done.Go(func() { t.upload(ctx) })
}

func (t *Store) upload(ctx context.Context) {
	q := t.queue
	backoff := queueMinBackoff
	for {
		t.drainMu.Lock()
		err := t.drain(ctx)
		t.drainMu.Unlock()
		q.mu.Lock()
		q.lastErr = err
		q.mu.Unlock()
		wait := time.Duration(0)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			t.log.Warn("upload queue: upload failed, will retry", "err", err, "in", backoff)
			wait = backoff
			backoff = min(2*backoff, queueMaxBackoff)
		} else {
			backoff = queueMinBackoff
		}
		var timer <-chan time.Time
		if wait > 0 {
			timer = time.After(wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-q.wake:
			if wait > 0 {
				// New work does not cut a backoff short.
				select {
				case <-ctx.Done():
					return
				case <-timer:
				}
			}
		case <-timer:
		}
	}
}

// drain uploads every queued file, oldest first.
func (t *Store) drain(ctx context.Context) error {
	q := t.queue
	for {
		q.mu.Lock()
		names := make([]string, 0, len(q.pending))
		for n := range q.pending {
			names = append(names, n)
		}
		q.mu.Unlock()
		if len(names) == 0 {
			return nil
		}
		slices.Sort(names)
		for _, name := range names {
			if err := t.uploadFile(ctx, name); err != nil {
				return err
			}
		}
	}
}

func (t *Store) uploadFile(ctx context.Context, name string) error {
	q := t.queue
	ids, err := q.read(name)
	if err != nil {
		return err
	}
	var srcs []s3store.Source
	for _, id := range ids {
		if t.isKnown(id) {
			continue
		}
		info, err := t.local.Stat(ctx, id)
		if errors.Is(err, cas.ErrNotFound) {
			t.log.Warn("upload queue: object gone from the cache before its upload", "object", id.String())
			continue
		}
		if err != nil {
			return err
		}
		srcs = append(srcs, t.source(info))
	}
	if len(srcs) > 0 {
		if err := t.remote.Upload(ctx, srcs); err != nil {
			return fmt.Errorf("upload queue: %w", err)
		}
		for _, s := range srcs {
			t.stats.Uploads.Add(1)
			t.stats.UploadedBytes.Add(s.Size)
			t.markKnown(s.ID)
		}
	}
	if err := os.Remove(filepath.Join(q.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("upload queue: %w", err)
	}
	q.mu.Lock()
	delete(q.pending, name)
	q.mu.Unlock()
	return nil
}

// Close stops the uploader (what is queued stays for the next start).
func (t *Store) Close() error {
	if t.queue != nil && t.queue.cancel != nil {
		t.queue.cancel()
		t.queue.done.Wait()
	}
	return nil
}

// Drain uploads what is queued now and returns the first failure (tests;
// the uploader does the same in the background).
func (t *Store) Drain(ctx context.Context) error {
	if t.queue == nil {
		return nil
	}
	t.drainMu.Lock()
	defer t.drainMu.Unlock()
	return t.drain(ctx)
}
