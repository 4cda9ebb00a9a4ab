package workspacetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/sandbox"
)

// longSleep is a command that outlives any step: a Run that returns before
// it ends was stopped, not finished.
func (s *suite) longSleep() string {
	return fmt.Sprintf("sleep %d", int((2*s.h.OpTimeout).Seconds())+1)
}

// promptly is how long a stopped Run, Upload or Download may take to return
// once its deadline or cancellation fires: generous for a remote provider,
// far shorter than longSleep.
func (s *suite) promptly() time.Duration {
	return min(s.h.OpTimeout/2, 20*time.Second)
}

// cancelReader hands out data; after after bytes it cancels the upload's
// context and then keeps handing out data slowly, at most tail more bytes,
// so an Upload that ignores its context ends with nil.
type cancelReader struct {
	r      io.Reader
	after  int64
	tail   int64
	cancel context.CancelFunc

	mu   sync.Mutex
	read int64
}

func (c *cancelReader) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.read >= c.after {
		c.cancel()
		if c.read >= c.after+c.tail {
			return 0, io.EOF
		}
		time.Sleep(10 * time.Millisecond)
		p = p[:min(len(p), 32<<10)]
	} else if int64(len(p)) > c.after-c.read {
		p = p[:c.after-c.read]
	}
	n, err := c.r.Read(p)
	c.read += int64(n)
	return n, err
}

// testCancellation: deadlines and cancellation end every call promptly with
// an error matching the context's, leave no session behind (Create that
// ends mid-way included), keep a file's old content when an Upload is
// cancelled, and leave the session usable.
func (s *suite) testCancellation(t *testing.T) {
	t.Run("CreateDeadline", func(t *testing.T) {
		n0 := s.mustCount(t)
		made, failed := 0, 0
		for _, d := range []time.Duration{-time.Second, 0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond} {
			ctx, cancel := context.WithTimeout(context.Background(), d)
			sess, err := s.h.Provider.Create(ctx, s.spec(t))
			cancel()
			if err != nil {
				failed++
				wantErr(t, fmt.Sprintf("Create with a %v deadline", d), err, context.DeadlineExceeded)
				continue
			}
			made++
			if d <= 0 {
				t.Errorf("Create with an expired context (%v) made session %s", d, sess.ID())
			}
			s.closeQuietly(t, sess)
		}
		t.Logf("of Creates with short deadlines, %d failed and %d finished in time", failed, made)
		s.waitCount(t, n0, "after Creates whose deadline passed")

		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := s.h.Provider.Create(ctx, s.spec(t))
		wantErr(t, "Create with a cancelled context", err, context.Canceled)
		s.waitCount(t, n0, "after a cancelled Create")
	})

	t.Run("RunTimeout", func(t *testing.T) {
		sess := s.create(t, nil)
		ctx := s.ctx(t)
		start := time.Now()
		_, err := sess.Run(ctx, sandbox.Spec{Timeout: 500 * time.Millisecond}, "echo started; "+s.longSleep()+"; echo finished")
		took := time.Since(start)
		if ctx.Err() != nil {
			t.Fatalf("the step's own context ended (%v): Spec.Timeout was not enforced", ctx.Err())
		}
		wantErr(t, "Run past its Spec.Timeout", err, context.DeadlineExceeded)
		if took > 500*time.Millisecond+s.promptly() {
			t.Errorf("Run with a 500ms Timeout returned after %v", took)
		}
		// A deadline on ctx works the same way.
		dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err = sess.Run(dctx, sandbox.Spec{}, s.longSleep())
		wantErr(t, "Run past its context's deadline", err, context.DeadlineExceeded)
		if got := s.sh(t, sess, "echo after timeout"); got != "after timeout\n" {
			t.Errorf("after timeouts, echo = %q", got)
		}
	})

	t.Run("RunCancel", func(t *testing.T) {
		sess := s.create(t, nil)
		ctx, cancel := context.WithCancel(s.ctx(t))
		defer cancel()
		out := newSyncBuffer("started")
		type result struct {
			res sandbox.Result
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := sess.Run(ctx, sandbox.Spec{Stdout: out}, "echo started; "+s.longSleep()+"; echo finished")
			done <- result{res, err}
		}()
		select {
		case <-out.seen:
		case r := <-done:
			t.Fatalf("Run returned before it was cancelled: exit %d, stderr %q, %v", r.res.ExitCode, clip(r.res.Stderr), r.err)
		case <-time.After(s.promptly()):
			cancel()
			select {
			case <-done:
			case <-time.After(s.h.OpTimeout):
			}
			t.Fatalf("no output reached Spec.Stdout within %v while the command slept: output is not streamed", s.promptly())
		}
		cancel()
		start := time.Now()
		var r result
		select {
		case r = <-done:
		case <-time.After(s.h.OpTimeout):
			t.Fatalf("Run did not return within %v of its cancellation", s.h.OpTimeout)
		}
		wantErr(t, "Run cancelled mid-way", r.err, context.Canceled)
		if took := time.Since(start); took > s.promptly() {
			t.Errorf("cancelled Run returned after %v", took)
		}
		if strings.Contains(out.String(), "finished") {
			t.Error("the cancelled command ran to its end")
		}

		cctx, ccancel := context.WithCancel(context.Background())
		ccancel()
		_, err := sess.Run(cctx, sandbox.Spec{}, "echo never")
		wantErr(t, "Run with a cancelled context", err, context.Canceled)
		if got := s.sh(t, sess, "echo after cancel"); got != "after cancel\n" {
			t.Errorf("after cancellations, echo = %q", got)
		}
	})

	t.Run("UploadCancel", func(t *testing.T) {
		sess := s.create(t, nil)
		old := []byte("old content\n")
		if err := sess.Write(s.ctx(t), "wst-cancel/f", old); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"wst-cancel/f", "wst-cancel/new"} {
			ctx, cancel := context.WithCancel(s.ctx(t))
			r := &cancelReader{r: newGen(s.seed, 7, 1<<40), after: 1 << 20, tail: 4 << 20, cancel: cancel}
			start := time.Now()
			err := sess.Upload(ctx, p, r)
			cancel()
			wantErr(t, "Upload cancelled mid-stream", err, context.Canceled)
			if took := time.Since(start); took > s.promptly() {
				t.Errorf("cancelled Upload returned after %v", took)
			}
			got, err := sess.Read(s.ctx(t), p)
			if p == "wst-cancel/f" {
				if err != nil || !bytes.Equal(got, old) {
					t.Errorf("after a cancelled Upload, the file reads %d bytes %q, %v; want the old content", len(got), clip(got), err)
				}
			} else {
				wantErr(t, "Read of a new file whose Upload was cancelled", err, fs.ErrNotExist)
			}
		}
		if fi, err := sess.List(s.ctx(t), "wst-cancel"); err != nil || len(fi) != 1 {
			t.Errorf("after cancelled uploads, wst-cancel lists %+v, %v; want f alone", fi, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		wantErr(t, "Upload with a cancelled context", sess.Upload(ctx, "wst-cancel/f", strings.NewReader("x")), context.Canceled)
		if got, err := sess.Read(s.ctx(t), "wst-cancel/f"); err != nil || !bytes.Equal(got, old) {
			t.Errorf("after an Upload with a cancelled context, the file reads %q, %v", clip(got), err)
		}
		if got := s.sh(t, sess, "cat wst-cancel/f"); got != string(old) {
			t.Errorf("after cancelled uploads, cat = %q", got)
		}
	})

	t.Run("DownloadCancel", func(t *testing.T) {
		sess := s.create(t, nil)
		const size = 16 << 20
		if err := sess.Upload(s.ctx(t), "wst-cancel/big", newGen(s.seed, 8, size)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(s.ctx(t))
		defer cancel()
		rc, err := sess.Download(ctx, "wst-cancel/big")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		if _, err := io.ReadFull(rc, make([]byte, 64<<10)); err != nil {
			t.Fatalf("reading the head of a download: %v", err)
		}
		cancel()
		n, err := io.Copy(io.Discard, rc)
		wantErr(t, "reading a download after its context was cancelled", err, context.Canceled)
		if n+64<<10 >= size {
			t.Errorf("a download cancelled after 64 KiB still delivered all %d bytes", size)
		}
		cctx, ccancel := context.WithCancel(context.Background())
		ccancel()
		_, err = sess.Download(cctx, "wst-cancel/big")
		wantErr(t, "Download with a cancelled context", err, context.Canceled)
		if n, _ := s.hashDownload(t, sess, "wst-cancel/big"); n != size {
			t.Errorf("after a cancelled download, a new one reads %d bytes, want %d", n, size)
		}
	})

	t.Run("NoLeak", func(t *testing.T) {
		// The subtests above closed what they made; count once more
		// through a fresh session's lifetime to prove the count moves.
		n0 := s.mustCount(t)
		sess := s.create(t, nil)
		s.waitCount(t, n0+1, "with one session open")
		if err := sess.Close(s.ctx(t)); err != nil {
			t.Fatal(err)
		}
		s.waitCount(t, n0, "after closing it")
	})
}
