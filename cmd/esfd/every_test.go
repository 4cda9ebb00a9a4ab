package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestEveryRunsOnTheInterval: the loop behind esfd's reapers (leases every
// second, made-up idempotency keys every minute) runs its task once per
// interval, logs what it did and its errors, and returns when its context
// ends. It runs on synctest's clock: an hour of the key-expiry loop takes
// no real time and no sleep stands in for synchronisation.
func TestEveryRunsOnTheInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		var mu sync.Mutex // Wait orders nothing for the race detector
		var runs []time.Duration
		ran := func() []time.Duration {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(runs)
		}
		start := time.Now()
		task := func(context.Context) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			runs = append(runs, time.Since(start))
			switch len(runs) {
			case 2:
				return 3, nil
			case 3:
				return 0, errors.New("journal unavailable")
			}
			return 0, nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			every(ctx, keyExpiryInterval, log, slog.LevelDebug, "expire idempotency keys", "deleted", task)
		}()

		time.Sleep(keyExpiryInterval - time.Nanosecond)
		synctest.Wait()
		if n := len(ran()); n != 0 {
			t.Fatalf("ran %d times before the first interval", n)
		}
		time.Sleep(59*keyExpiryInterval + time.Nanosecond)
		synctest.Wait()
		got := ran()
		if len(got) != 60 {
			t.Fatalf("ran %d times in an hour, want 60", len(got))
		}
		for i, at := range got {
			if want := time.Duration(i+1) * keyExpiryInterval; at != want {
				t.Fatalf("run %d at %v, want %v", i, at, want)
			}
		}
		cancel()
		<-done // returns once cancelled, without another run
		if n := len(ran()); n != 60 {
			t.Errorf("ran %d times, want no run after the cancel", n)
		}
		out := logs.String() // every's goroutine has returned
		if !strings.Contains(out, `msg="expire idempotency keys" deleted=3`) {
			t.Errorf("the run that deleted 3 keys is not logged:\n%s", out)
		}
		if !strings.Contains(out, `level=ERROR msg="expire idempotency keys" err="journal unavailable"`) {
			t.Errorf("the failed run is not logged:\n%s", out)
		}
		if n := strings.Count(out, "\n"); n != 2 {
			t.Errorf("%d log lines, want 2 (idle runs log nothing):\n%s", n, out)
		}
	})
}
