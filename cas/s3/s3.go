package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/errdefs"
)

// Defaults of Options. Measured against versitygw on loopback (2 loaded
// cores, 20 sequential requests per size): a PUT has about 2 ms of fixed
// cost and saturates near 118 MiB/s from 1 MiB on (4 KiB: 2.0 ms, 64 KiB:
// 4.0 ms, 256 KiB: 11.8 ms, 1 MiB: 8.5 ms, 8 MiB: 68 ms, 32 MiB: 358 ms).
// Below about 256 KiB the fixed cost is most of an object's time, so
// smaller objects travel in packs; an 8 MiB pack is at full throughput
// while a retry of it stays cheap, and ranged GETs serve its members.
const (
	DefaultPackThreshold = 256 << 10
	DefaultPackSize      = 8 << 20
	// memLimit is the largest object a Put holds in memory; larger ones
	// spool to a temp file.
	memLimit = 8 << 20
)

// Options configures New.
type Options struct {
	// Client is the S3 client (see NewClient).
	Client *awss3.Client
	// Bucket and Prefix locate the store; Prefix may be empty.
	Bucket, Prefix string
	// TempDir holds spooled objects of Puts and batches in progress;
	// default os.TempDir().
	TempDir string
	// PackThreshold: objects smaller than this travel in packs (batches and
	// Upload). Zero means DefaultPackThreshold; negative disables packs.
	PackThreshold int64
	// PackSize is the most bytes of objects in one pack; zero means
	// DefaultPackSize.
	PackSize int64
	// Parallel is how many requests an Upload or a batch commit has in
	// flight; zero means 8.
	Parallel int
}

// Store is a cas.Store on S3.
type Store struct {
	c       *awss3.Client
	bucket  string
	prefix  string // "" or ending in "/"
	tmp     string
	thresh  int64
	packMax int64
	par     int

	mu     sync.Mutex
	idx    map[cas.ID]loc     // packed objects
	packs  map[string][]entry // loaded indexes by name
	loaded bool
	// epoch counts index reloads started, doneEpoch is the epoch of the
	// last one finished (see reload).
	epoch, doneEpoch uint64
	refresh          sync.Mutex // one index reload at a time
	repack           sync.Mutex // one repack at a time

	stats Stats
}

// loc is where a packed object lives.
type loc struct {
	pack      string // index name (hex)
	off, size int64
}

// Stats counts requests and bytes, for tests and metrics.
type Stats struct {
	Gets, Puts, Heads, Lists, Deletes atomic.Int64
	BytesIn, BytesOut                 atomic.Int64
}

var (
	_ cas.Store   = (*Store)(nil)
	_ cas.Batcher = (*Store)(nil)
)

// New returns a store on opts.Client.
func New(opts Options) (*Store, error) {
	if opts.Client == nil || opts.Bucket == "" {
		return nil, fmt.Errorf("s3 store: client and bucket are required: %w", cas.ErrInvalidArgument)
	}
	s := &Store{
		c: opts.Client, bucket: opts.Bucket, tmp: opts.TempDir,
		thresh: opts.PackThreshold, packMax: opts.PackSize, par: opts.Parallel,
		idx: map[cas.ID]loc{}, packs: map[string][]entry{},
	}
	if p := strings.Trim(opts.Prefix, "/"); p != "" {
		s.prefix = p + "/"
	}
	if s.tmp == "" {
		s.tmp = os.TempDir()
	}
	if s.thresh == 0 {
		s.thresh = DefaultPackThreshold
	}
	if s.packMax <= 0 {
		s.packMax = DefaultPackSize
	}
	if s.par <= 0 {
		s.par = 8
	}
	return s, nil
}

// Stats returns the store's request counters.
func (s *Store) Stats() *Stats { return &s.stats }

// Bucket and Prefix locate the store.
func (s *Store) Bucket() string { return s.bucket }

// Prefix is the key prefix ("" or ending in "/").
func (s *Store) Prefix() string { return s.prefix }

// Location is where the store keeps its objects, for humans.
func (s *Store) Location() string { return "s3://" + s.bucket + "/" + s.prefix }

// URL is a parsed --cas-remote value:
//
//	s3://BUCKET[/PREFIX][?endpoint=URL&region=REGION&path_style=true|false]
type URL struct {
	Bucket, Prefix, Endpoint, Region string
	// PathStyle addresses buckets in the path (default with an endpoint:
	// third-party servers rarely have virtual-host DNS).
	PathStyle bool
}

// ParseURL parses a --cas-remote value.
func ParseURL(raw string) (URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return URL{}, fmt.Errorf("remote %q: %v: %w", raw, err, cas.ErrInvalidArgument)
	}
	if u.Scheme != "s3" || u.Host == "" {
		return URL{}, fmt.Errorf("remote %q: want s3://BUCKET/PREFIX?endpoint=...&region=...: %w", raw, cas.ErrInvalidArgument)
	}
	q := u.Query()
	r := URL{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/"), Endpoint: q.Get("endpoint"), Region: q.Get("region")}
	r.PathStyle = r.Endpoint != ""
	if v := q.Get("path_style"); v != "" {
		r.PathStyle = v == "true" || v == "1"
	}
	for k := range q {
		switch k {
		case "endpoint", "region", "path_style":
		default:
			return URL{}, fmt.Errorf("remote %q: unknown parameter %q: %w", raw, k, cas.ErrInvalidArgument)
		}
	}
	return r, nil
}

// NewClient makes an S3 client for u with credentials from the standard
// AWS environment variables and files (config.LoadDefaultConfig). Request
// checksums are sent only when required, which third-party servers need;
// the retryer backs off exponentially over up to 6 attempts; connections
// time out rather than hang.
func NewClient(ctx context.Context, u URL) (*awss3.Client, error) {
	opts := []func(*config.LoadOptions) error{
		config.WithHTTPClient(httpClient()),
		config.WithRetryer(newRetryer),
	}
	if u.Region != "" {
		opts = append(opts, config.WithRegion(u.Region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("s3 config: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	return awss3.NewFromConfig(cfg, func(o *awss3.Options) {
		if u.Endpoint != "" {
			o.BaseEndpoint = aws.String(u.Endpoint)
		}
		o.UsePathStyle = u.PathStyle
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	}), nil
}

// ClientOptions sets the same policies as NewClient on explicit options
// (tests build clients with static credentials).
func ClientOptions(o *awss3.Options) {
	o.HTTPClient = httpClient()
	o.Retryer = newRetryer()
	o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
	o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
}

func newRetryer() aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = 6
		o.MaxBackoff = 5 * time.Second
		// No client-side rate limiting of retries: a server that is down
		// for a while must not exhaust a token bucket that then fails
		// requests after it is back.
		o.RateLimiter = noRateLimit{}
	})
}

type noRateLimit struct{}

func (noRateLimit) GetToken(context.Context, uint) (func() error, error) {
	return func() error { return nil }, nil
}
func (noRateLimit) AddTokens(uint) error { return nil }

// httpClient bounds connecting and waiting for response headers, so a
// server that hangs fails the request (and the retryer tries again)
// instead of blocking a seal for ever. A buildable client, so that the
// SDK's configuration (AWS_CA_BUNDLE) can still adjust its transport.
func httpClient() *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = 10 * time.Second }).
		WithTransportOptions(func(tr *http.Transport) {
			tr.ResponseHeaderTimeout = 60 * time.Second
			tr.MaxIdleConnsPerHost = 64
		})
}

func (s *Store) looseKey(id cas.ID) string { return s.prefix + "o/" + id.String() }
func (s *Store) packKey(name string) string {
	return s.prefix + "p/" + name + ".pack"
}
func (s *Store) idxKey(name string) string { return s.prefix + "p/" + name + ".idx" }

// status is the HTTP status of an SDK error, or 0.
func status(err error) int {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

func isNotFound(err error) bool {
	var nk *types.NoSuchKey
	var nf *types.NotFound
	return errors.As(err, &nk) || errors.As(err, &nf) || status(err) == http.StatusNotFound
}

// wrap classifies an SDK error: context errors stay themselves, a missing
// key is ErrNotFound, anything else (the server down, 5xx after retries)
// is ErrUnavailable.
func wrap(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("s3 %s: %w", op, err)
	case isNotFound(err):
		return fmt.Errorf("s3 %s: %w", op, cas.ErrNotFound)
	case errors.Is(err, cas.ErrCorrupt), errors.Is(err, cas.ErrNotFound):
		return fmt.Errorf("s3 %s: %w", op, err)
	default:
		return fmt.Errorf("s3 %s: %v: %w", op, err, errdefs.ErrUnavailable)
	}
}

// putIfAbsent writes body under key unless the key exists. created is
// false when it did (412).
func (s *Store) putIfAbsent(ctx context.Context, key string, body io.ReadSeeker, size int64) (created bool, err error) {
	s.stats.Puts.Add(1)
	_, err = s.c.PutObject(ctx, &awss3.PutObjectInput{
		Bucket: aws.String(s.bucket), Key: aws.String(key), Body: body,
		ContentLength: aws.Int64(size), IfNoneMatch: aws.String("*"),
		ContentType: aws.String("application/octet-stream"),
	})
	if err == nil {
		s.stats.BytesOut.Add(size)
		return true, nil
	}
	// 412: someone stored it first; 409 (ConditionalRequestConflict): a
	// concurrent conditional write of the same key is in progress, and
	// since keys name their content the other writer's bytes are ours.
	if st := status(err); st == http.StatusPreconditionFailed || st == http.StatusConflict {
		return false, nil
	}
	return false, err
}

// Has implements cas.Haser.
func (s *Store) Has(ctx context.Context, id cas.ID) (bool, error) {
	_, err := s.Stat(ctx, id)
	if errors.Is(err, cas.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Stat implements cas.Statter.
func (s *Store) Stat(ctx context.Context, id cas.ID) (cas.Info, error) {
	if err := ctx.Err(); err != nil {
		return cas.Info{}, err
	}
	if l, ok, err := s.lookup(ctx, id, false); err != nil {
		return cas.Info{}, err
	} else if ok {
		return cas.Info{ID: id, Size: l.size}, nil
	}
	s.stats.Heads.Add(1)
	out, err := s.c.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.looseKey(id))})
	if err == nil {
		return cas.Info{ID: id, Size: aws.ToInt64(out.ContentLength)}, nil
	}
	if !isNotFound(err) {
		return cas.Info{}, wrap("stat "+id.Short(), err)
	}
	// Not loose: maybe in a pack another writer added.
	if l, ok, err := s.lookup(ctx, id, true); err != nil {
		return cas.Info{}, err
	} else if ok {
		return cas.Info{ID: id, Size: l.size}, nil
	}
	return cas.Info{}, fmt.Errorf("stat %s: %w", id.Short(), cas.ErrNotFound)
}

// Get implements cas.Getter. The reader verifies the bytes: the read that
// reaches the end returns cas.ErrCorrupt instead of io.EOF if they do not
// match id (a short body fails with io.ErrUnexpectedEOF).
func (s *Store) Get(ctx context.Context, id cas.ID) (io.ReadCloser, error) {
	return s.get(ctx, id, 0, -1)
}

// GetRange opens length bytes of id from off (length -1: to the end)
// without verifying them: the caller verifies what it assembles. It serves
// large blobs in pieces.
func (s *Store) GetRange(ctx context.Context, id cas.ID, off, length int64) (io.ReadCloser, error) {
	if off < 0 || length < -1 {
		return nil, fmt.Errorf("get range %s: bad range: %w", id.Short(), cas.ErrInvalidArgument)
	}
	return s.get(ctx, id, off, length)
}

func (s *Store) get(ctx context.Context, id cas.ID, off, length int64) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	verify := off == 0 && length < 0
	for attempt := 0; ; attempt++ {
		l, packed, err := s.lookup(ctx, id, attempt > 0)
		if err != nil {
			return nil, err
		}
		key, start, n := s.looseKey(id), off, length
		if packed {
			key, start = s.packKey(l.pack), l.off+off
			if n < 0 || off+n > l.size {
				n = max(l.size-off, 0)
			}
		}
		in := &awss3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)}
		if packed || off > 0 || length >= 0 {
			if n == 0 {
				return verifyOrEmpty(id, verify), nil
			}
			if n > 0 {
				in.Range = aws.String(fmt.Sprintf("bytes=%d-%d", start, start+n-1))
			} else {
				in.Range = aws.String(fmt.Sprintf("bytes=%d-", start))
			}
		}
		s.stats.Gets.Add(1)
		out, err := s.c.GetObject(ctx, in)
		if err != nil {
			// A loose miss may be a pack we have not loaded; a pack miss may
			// be a repack that replaced it: reload the indexes once.
			if isNotFound(err) && attempt == 0 {
				continue
			}
			if status(err) == http.StatusRequestedRangeNotSatisfiable {
				return io.NopCloser(bytes.NewReader(nil)), nil
			}
			return nil, wrap("get "+id.Short(), err)
		}
		body := &countReader{r: out.Body, c: out.Body, n: &s.stats.BytesIn}
		if !verify {
			return body, nil
		}
		return cas.VerifyingReader(id, body), nil
	}
}

func verifyOrEmpty(id cas.ID, verify bool) io.ReadCloser {
	if verify {
		return cas.VerifyingReader(id, io.NopCloser(bytes.NewReader(nil)))
	}
	return io.NopCloser(bytes.NewReader(nil))
}

type countReader struct {
	r io.Reader
	c io.Closer
	n *atomic.Int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countReader) Close() error { return c.c.Close() }

// Put implements cas.Putter: it spools r (in memory up to 8 MiB, then in a
// temp file) while hashing, then stores the object loose with a
// conditional PUT. An object already known to be in a pack is not stored
// again.
func (s *Store) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	sp, err := spool(ctx, r, s.tmp)
	if err != nil {
		return cas.Info{}, false, err
	}
	defer sp.Close()
	if _, ok, err := s.lookup(ctx, sp.id, false); err != nil {
		return cas.Info{}, false, err
	} else if ok {
		return sp.info(), false, nil
	}
	created, err := s.putIfAbsent(ctx, s.looseKey(sp.id), sp.reader(), sp.size)
	if err != nil {
		return cas.Info{}, false, wrap("put "+sp.id.Short(), err)
	}
	return sp.info(), created, nil
}

// Delete implements cas.Deleter: the loose copy is deleted, and every pack
// that holds id is rewritten without it.
func (s *Store) Delete(ctx context.Context, id cas.ID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.stats.Deletes.Add(1)
	if _, err := s.c.DeleteObject(ctx, &awss3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.looseKey(id))}); err != nil && !isNotFound(err) {
		return wrap("delete "+id.Short(), err)
	}
	if err := s.reload(ctx); err != nil {
		return err
	}
	// Each repack drops the pack from the index; another pack may hold a
	// copy too.
	for range 1000 {
		s.mu.Lock()
		l, ok := s.idx[id]
		s.mu.Unlock()
		if !ok {
			return nil
		}
		if err := s.Repack(ctx, l.pack, func(x cas.ID) bool { return x != id }); err != nil {
			return err
		}
	}
	return fmt.Errorf("delete %s: still indexed after repacking: %w", id.Short(), cas.ErrFailedPrecondition)
}

// Walk implements cas.Walker: loose objects, then packed ones (each id
// once).
func (s *Store) Walk(ctx context.Context, fn func(cas.Info) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.reload(ctx); err != nil {
		return err
	}
	seen := map[cas.ID]bool{}
	emit := func(info cas.Info) error {
		if seen[info.ID] {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		seen[info.ID] = true
		return fn(info)
	}
	err := s.list(ctx, s.prefix+"o/", func(key string, size int64) error {
		id, err := cas.ParseID(strings.TrimPrefix(key, s.prefix+"o/"))
		if err != nil {
			return nil // not ours
		}
		return emit(cas.Info{ID: id, Size: size})
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	packed := make([]cas.Info, 0, len(s.idx))
	for id, l := range s.idx {
		packed = append(packed, cas.Info{ID: id, Size: l.size})
	}
	s.mu.Unlock()
	for _, info := range packed {
		if err := emit(info); err != nil {
			return err
		}
	}
	return nil
}

// list calls fn for every key under prefix with its size.
func (s *Store) list(ctx context.Context, prefix string, fn func(key string, size int64) error) error {
	return s.listObjects(ctx, prefix, func(o types.Object) error { return fn(aws.ToString(o.Key), aws.ToInt64(o.Size)) })
}

// listObjects calls fn for every object under prefix.
func (s *Store) listObjects(ctx context.Context, prefix string, fn func(types.Object) error) error {
	p := awss3.NewListObjectsV2Paginator(s.c, &awss3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		s.stats.Lists.Add(1)
		page, err := p.NextPage(ctx)
		if err != nil {
			return wrap("list "+prefix, err)
		}
		for _, o := range page.Contents {
			if err := fn(o); err != nil {
				return err
			}
		}
	}
	return nil
}
