package fabric

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/journal"
)

// TestLeaseExpiresOnTheInjectedClock: ExpireLeases fails an attempt
// exactly when its lease has run out on the fabric's clock (Options.Now),
// not a moment before, and a renewal moves the deadline; no test waits for
// real time to pass.
func TestLeaseExpiresOnTheInjectedClock(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	advance := func(d time.Duration) { clock.Add(int64(d)) }
	ctx := context.Background()
	f, err := Open(ctx, logicOptions(Options{StateDir: t.TempDir(), Now: now}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		f.Close()
	})
	g := newGroup(t, f, map[string]string{"a": "1"})
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, TTLMillis: 1000})
	if err != nil {
		t.Fatal(err)
	}
	expire := func() int {
		t.Helper()
		n, err := f.ExpireLeases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	state := func() journal.AttemptState {
		t.Helper()
		in, err := f.Inspect(ctx, a.AttemptID)
		if err != nil {
			t.Fatal(err)
		}
		return in.Attempt.State
	}

	advance(999 * time.Millisecond)
	if n := expire(); n != 0 || state() != journal.AttemptActive {
		t.Fatalf("1 ms before its lease ran out: %d expired, attempt %s", n, state())
	}
	// A renewal at 999 ms runs the full ttl again from there.
	if _, err := f.Renew(ctx, RenewRequest{LeaseID: a.Lease.LeaseID, Token: a.Lease.Token}); err != nil {
		t.Fatal(err)
	}
	advance(999 * time.Millisecond)
	if n := expire(); n != 0 || state() != journal.AttemptActive {
		t.Fatalf("renewed lease expired early: %d expired, attempt %s", n, state())
	}
	advance(time.Millisecond)
	if n := expire(); n != 1 || state() != journal.AttemptFailed {
		t.Fatalf("at the renewed deadline: %d expired, attempt %s; want 1, failed", n, state())
	}
	if f.mounter.Mounted(a.Root) {
		t.Errorf("the expired attempt's root %s is still mounted", a.Root)
	}
	if n := expire(); n != 0 {
		t.Errorf("a second sweep expired %d more", n)
	}
}
