package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/failpoint"
	"github.com/esf-dev/esf/journal/internal/kvutil"
)

// Options configure a Store. Endpoints (or Client) and Prefix are required;
// every other field has a default.
type Options struct {
	// Endpoints are the cluster's client URLs or host:port pairs.
	Endpoints []string
	// Prefix is the cluster prefix every key of this journal lives under,
	// e.g. "esf" (keys "/esf/..."). Several journals share a cluster under
	// different prefixes.
	Prefix string
	// TLS, if set, is the client's TLS configuration (CA, client
	// certificate); nil speaks plain gRPC.
	TLS *tls.Config
	// Username and Password authenticate to a cluster with auth enabled.
	Username, Password string
	// DialTimeout bounds connecting at Open; default 10 s.
	DialTimeout time.Duration
	// Client, if set, is used instead of dialling Endpoints; Close leaves
	// it open.
	Client *clientv3.Client

	// Now is the clock behind Reader.Now; default time.Now.
	Now func() time.Time
	// Failpoint is evaluated at the journal.Failpoint* boundaries of every
	// Update; default failpoint.Inject.
	Failpoint func(name string) error
	// Logger receives what the background work (event indexing, the watch,
	// compaction) could not do; default discards it.
	Logger *slog.Logger

	// CompactEvery is how often the store compacts etcd's history (to the
	// revision of the previous round, so a read may take that long) and
	// clears its tombstones, stale staged writes and old outcome markers.
	// Default 5 minutes; negative turns the maintenance off (another
	// client of the cluster must do it).
	CompactEvery time.Duration
	// IndexDelay is how long the event indexer lets commits accumulate
	// before it moves their events into the log; default 20 ms.
	IndexDelay time.Duration
	// UnavailableTimeout is how long an operation keeps retrying while the
	// cluster cannot answer (no leader, lost members) before it fails with
	// ErrUnavailable; default 30 s.
	UnavailableTimeout time.Duration
	// RollForwardStall is how long a reader waits for the writer of a
	// published large transaction to make progress before rolling it
	// forward itself; default 1 s.
	RollForwardStall time.Duration
	// MaxTxnOps and MaxRequestBytes are the cluster's --max-txn-ops and
	// --max-request-bytes; default etcd's defaults (128, 1.5 MiB). No
	// request of the store exceeds them.
	MaxTxnOps       int
	MaxRequestBytes int

	// noWatch leaves the watch loop off (tests run it themselves).
	noWatch bool
}

// Defaults of Options.
const (
	DefaultCompactEvery       = 5 * time.Minute
	DefaultIndexDelay         = 20 * time.Millisecond
	DefaultUnavailableTimeout = 30 * time.Second
	DefaultRollForwardStall   = time.Second
	DefaultMaxTxnOps          = 128
	DefaultMaxRequestBytes    = 3 << 19 // 1.5 MiB
)

// validate checks o and fills in defaults.
func (o *Options) validate() error {
	if o.Client == nil && len(o.Endpoints) == 0 {
		return fmt.Errorf("etcd journal: no endpoints: %w", journal.ErrInvalidArgument)
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Failpoint == nil {
		o.Failpoint = failpoint.Inject
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.CompactEvery == 0 {
		o.CompactEvery = DefaultCompactEvery
	}
	if o.IndexDelay <= 0 {
		o.IndexDelay = DefaultIndexDelay
	}
	if o.UnavailableTimeout <= 0 {
		o.UnavailableTimeout = DefaultUnavailableTimeout
	}
	if o.RollForwardStall <= 0 {
		o.RollForwardStall = DefaultRollForwardStall
	}
	if o.MaxTxnOps == 0 {
		o.MaxTxnOps = DefaultMaxTxnOps
	}
	if o.MaxRequestBytes == 0 {
		o.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if o.MaxTxnOps < 16 || o.MaxRequestBytes < 5<<18 {
		return fmt.Errorf("etcd journal: max txn ops %d, max request bytes %d: want at least 16 and 1.25 MiB: %w",
			o.MaxTxnOps, o.MaxRequestBytes, journal.ErrInvalidArgument)
	}
	return nil
}

// Store is the etcd journal.Store.
type Store struct {
	opts   Options
	cli    *clientv3.Client
	ownCli bool
	k      keys
	lim    limits
	notify kvutil.Broadcaster

	// closeMu is held shared by every transaction and exclusively by
	// Close, so the client is never closed under a running one.
	closeMu sync.RWMutex
	closed  bool

	bgCtx    context.Context // ends at Close: the background loops
	bgCancel context.CancelFunc
	bg       sync.WaitGroup
	kick     chan struct{} // wakes the indexer
	// noCompact: the cluster refused this user compaction (auth).
	noCompact atomic.Bool
	// fence, once the store registered as a worker, is the compare every
	// commit carries (worker.go); reg is that registration.
	fence atomic.Pointer[fence]
	reg   atomic.Pointer[Registration]
}

var _ journal.Store = (*Store)(nil)

// Open connects to the cluster, records or checks the schema version under
// the prefix and starts the store's background work: the watch behind
// Notify, the event indexer and the periodic maintenance.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	k, err := newKeys(opts.Prefix)
	if err != nil {
		return nil, err
	}
	s := &Store{opts: opts, k: k, cli: opts.Client, lim: newLimits(opts.MaxTxnOps, opts.MaxRequestBytes),
		kick: make(chan struct{}, 1)}
	if s.cli == nil {
		s.cli, err = clientv3.New(clientv3.Config{
			Endpoints:   opts.Endpoints,
			DialTimeout: opts.DialTimeout,
			TLS:         opts.TLS,
			Username:    opts.Username,
			Password:    opts.Password,
			// Dead connections are noticed within seconds, not minutes.
			DialKeepAliveTime:    5 * time.Second,
			DialKeepAliveTimeout: 5 * time.Second,
			// Send as much as the server accepts; receive any range reply.
			MaxCallSendMsgSize: opts.MaxRequestBytes + 64<<10,
			RejectOldCluster:   true,
			Logger:             zap.NewNop(),
			Context:            context.WithoutCancel(ctx),
		})
		if err != nil {
			return nil, fmt.Errorf("etcd journal %v: %w", opts.Endpoints, s.mapErr(ctx, err))
		}
		s.ownCli = true
	}
	rev, err := s.checkSchema(ctx)
	if err != nil {
		if s.ownCli {
			s.cli.Close()
		}
		return nil, err
	}
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	if !opts.noWatch {
		s.bg.Go(func() { s.watchLoop(s.bgCtx, rev+1) })
	}
	s.bg.Go(func() { s.indexLoop(s.bgCtx) })
	if opts.CompactEvery > 0 {
		s.bg.Go(func() { s.maintainLoop(s.bgCtx) })
	}
	s.kickIndexer() // events a dead writer left unindexed
	return s, nil
}

// checkSchema writes the schema marker into an empty journal or checks the
// one there, and returns the revision it read at.
func (s *Store) checkSchema(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.DialTimeout)
	defer cancel()
	key := s.k.data(string(kvutil.SchemaKey))
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Version(key), "=", 0)).
		Then(clientv3.OpPut(key, string(kvutil.SchemaValue()))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return 0, fmt.Errorf("etcd journal %v: %w", s.opts.Endpoints, s.mapErr(ctx, err))
	}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) != 1 {
			return 0, fmt.Errorf("etcd journal: schema key vanished: %w", journal.ErrCorrupt)
		}
		if err := kvutil.CheckSchema(kvs[0].Value); err != nil {
			return 0, fmt.Errorf("etcd journal %s: %w", s.k.p, err)
		}
	}
	return resp.Header.Revision, nil
}

// enter admits a transaction; the returned func ends it.
func (s *Store) enter(ctx context.Context) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return nil, journal.ErrClosed
	}
	return s.closeMu.RUnlock, nil
}

// View implements journal.Store: every read of fn is at the revision of its
// first read.
func (s *Store) View(ctx context.Context, fn func(r journal.Reader) error) error {
	exit, err := s.enter(ctx)
	if err != nil {
		return err
	}
	defer exit()
	r := &reader{s: s, ctx: ctx, now: s.now()}
	defer r.end()
	return fn(r)
}

// Update implements journal.Store (see the package doc for the protocol).
func (s *Store) Update(ctx context.Context, fn func(tx journal.Tx) error) error {
	exit, err := s.enter(ctx)
	if err != nil {
		return err
	}
	defer exit()
	if err := s.opts.Failpoint(journal.FailpointUpdateBegin); err != nil {
		return err
	}
	var retry retrier
	for {
		t := newTx(s, ctx)
		ferr := fn(t)
		t.end()
		if err := ctx.Err(); err != nil {
			return err
		}
		if t.fault != nil {
			// A read failed for a reason a new attempt may not meet (no
			// quorum for a moment, a snapshot compacted away): fn saw an
			// error that is not its own, so run it again.
			if err := retry.transient(ctx, s, t.fault); err != nil {
				return err
			}
			continue
		}
		if ferr != nil {
			return ferr
		}
		if len(t.writes) == 0 && len(t.events) == 0 {
			return nil
		}
		if err := s.opts.Failpoint(journal.FailpointUpdateBeforeCommit); err != nil {
			return err
		}
		res, err := s.commit(ctx, t)
		if err != nil {
			return err
		}
		switch res {
		case committed:
			if len(t.events) > 0 {
				s.notify.Broadcast()
				s.kickIndexer()
			}
			return s.opts.Failpoint(journal.FailpointUpdateAfterCommit)
		case conflicted:
			if err := retry.conflict(ctx); err != nil {
				return err
			}
		case lost:
			if err := retry.transient(ctx, s, errLost); err != nil {
				return err
			}
		}
	}
}

// Notify implements journal.Store: the channel closes after a commit of
// this store that appended events, and after any commit of the cluster
// that did, as the watch on pending events sees it.
func (s *Store) Notify() <-chan struct{} { return s.notify.Wait() }

// Close implements journal.Store.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	s.closeMu.Unlock()
	s.bgCancel()
	s.bg.Wait()
	s.notify.Close()
	if s.ownCli {
		if err := s.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("close etcd journal: %w", err)
		}
	}
	return nil
}

// FlushEvents indexes every pending event now (backups and tests read the
// log's keys directly; readers through the Store never need it).
func (s *Store) FlushEvents(ctx context.Context) error {
	exit, err := s.enter(ctx)
	if err != nil {
		return err
	}
	defer exit()
	var retry retrier
	for {
		more, err := s.indexOnce(ctx)
		if err != nil {
			if rerr := retry.transient(ctx, s, err); rerr != nil {
				return rerr
			}
			continue
		}
		if !more {
			return nil
		}
	}
}

// Prefix is the store's cluster prefix, without its slashes ("esf").
func (s *Store) Prefix() string { return s.k.p[1 : len(s.k.p)-1] }

// Client is the store's etcd client.
func (s *Store) Client() *clientv3.Client { return s.cli }

func (s *Store) now() time.Time { return s.opts.Now().UTC() }

func (s *Store) kickIndexer() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// mapErr turns a client error into the journal's classes: the caller's
// context error unchanged, a cluster that cannot answer ErrUnavailable.
func (s *Store) mapErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	err = rpctypes.Error(err) // a gRPC status of etcd's as its error value
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("etcd: %w", err)
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("etcd: the snapshot's revision was compacted: %w", journal.ErrUnavailable)
	case errors.Is(err, rpctypes.ErrPermissionDenied), errors.Is(err, rpctypes.ErrAuthFailed),
		errors.Is(err, rpctypes.ErrInvalidAuthToken), errors.Is(err, rpctypes.ErrUserEmpty):
		return fmt.Errorf("etcd: %v (check the journal's user, password and role): %w", err, journal.ErrFailedPrecondition)
	case transient(err):
		return fmt.Errorf("etcd: %v: %w", err, journal.ErrUnavailable)
	}
	return fmt.Errorf("etcd: %w", err)
}

// transient reports whether err may go away by itself: the cluster has no
// leader or quorum for a moment, a member went away, it sheds load.
func transient(err error) bool {
	err = rpctypes.Error(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		switch ee.Code() {
		case codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
			return true
		}
		return false
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
			return true
		}
	}
	return false
}

// errLost is a commit that did not happen for a transient reason (its
// writer aborted it after losing the reply).
var errLost = fmt.Errorf("etcd: commit lost: %w", journal.ErrUnavailable)

// retrier paces the attempts of one operation: conflicts retry until the
// context ends, with jittered exponential backoff; transient failures
// retry for Options.UnavailableTimeout at most.
type retrier struct {
	n          int
	unavailErr error
	since      time.Time
}

func (r *retrier) conflict(ctx context.Context) error {
	r.n++
	return sleep(ctx, backoff(r.n, time.Millisecond, 64*time.Millisecond))
}

func (r *retrier) transient(ctx context.Context, s *Store, err error) error {
	if errors.Is(err, journal.ErrUnavailable) || transient(err) {
		if r.since.IsZero() {
			r.since = time.Now()
		}
		if time.Since(r.since) > s.opts.UnavailableTimeout {
			return fmt.Errorf("etcd journal unavailable for %v: %w", s.opts.UnavailableTimeout, err)
		}
		r.n++
		return sleep(ctx, backoff(r.n, 10*time.Millisecond, 500*time.Millisecond))
	}
	return err
}

// backoff is attempt n's wait: exponential from base, capped, with full
// jitter so that contending writers spread out.
func backoff(n int, base, limit time.Duration) time.Duration {
	d := base << min(n, 20)
	if d <= 0 || d > limit {
		d = limit
	}
	return time.Duration(rand.Int64N(int64(d)) + 1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
