package wasi

import (
	"context"
	"io"
	"sync"
	"time"
)

// stdin hands the guest the caller's reader, but never as an *os.File:
// wazero would then read the descriptor directly and no deadline could
// reach it. A Read that starts after ctx ended fails at once.
type stdin struct {
	ctx context.Context
	r   io.Reader
}

func (s *stdin) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, err
	}
	return s.r.Read(p)
}

type stdout struct {
	ctx context.Context
	w   io.Writer
}

func (s *stdout) Write(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, err
	}
	return s.w.Write(p)
}

type readDeadliner interface{ SetReadDeadline(time.Time) error }
type writeDeadliner interface{ SetWriteDeadline(time.Time) error }

// unblockOnDone arranges for a Read or Write blocked in a host call (the
// guest waiting on an empty pipe, say) to return when ctx ends: wazero
// stops a module only between guest instructions, never inside a host
// call. It works for streams with deadlines (os.Pipe ends, net.Conn); a
// plain io.Reader that blocks keeps Run waiting until it returns. The
// returned func undoes the arrangement and waits for a callback already
// running, so nothing outlives Run; deadlines already set stay set.
func unblockOnDone(ctx context.Context, in io.Reader, outs ...io.Writer) (stop func()) {
	var (
		wg    sync.WaitGroup
		stops []func() bool
	)
	after := func(f func()) {
		wg.Add(1)
		stop := context.AfterFunc(ctx, func() { defer wg.Done(); f() })
		stops = append(stops, func() bool {
			if stop() {
				wg.Done() // f will never run
				return true
			}
			return false
		})
	}
	if d, ok := in.(readDeadliner); ok {
		after(func() { _ = d.SetReadDeadline(time.Now()) })
	}
	for _, w := range outs {
		if d, ok := w.(writeDeadliner); ok {
			after(func() { _ = d.SetWriteDeadline(time.Now()) })
		}
	}
	return func() {
		for _, s := range stops {
			s()
		}
		wg.Wait()
	}
}
