package bench_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/esf-dev/esf/bench"
	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	s3store "github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/cas/tier"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/s3test"
	"github.com/esf-dev/esf/internal/testenv"
)

// Content on S3 (issue 19), against versitygw on loopback (posix backend
// on the same disk):
//   - a seal of one 4 KiB change with sync remote durability (answered
//     after the new objects are in the bucket) against the same seal on a
//     daemon without a remote, interleaved;
//   - restore throughput: every object of a set of 4 MiB blobs fetched
//     into an empty cache through cas/tier (GET, BLAKE3 verify, local
//     durable write), against a plain loop of GETs of the same keys read
//     to io.Discard;
//   - activate + first read of one file in a 10k/100k-file root by a new
//     daemon with an empty cache (the restore path), against the same on a
//     daemon with a warm cache.

func init() {
	bench.Register(bench.Scenario{Name: "s3", Order: 95, Run: benchS3})
}

func benchS3(ctx context.Context, e *bench.Env) error {
	if err := testenv.Check("s3"); err != nil {
		e.TODO("content on S3", fmt.Sprintf("%v (make bench sets it)", err))
		return nil
	}
	srv, err := s3test.StartServer()
	if err != nil {
		return err
	}
	e.Cleanup(func() error { srv.Stop(); return nil })
	bucket, err := srv.NewBucket(ctx)
	if err != nil {
		return err
	}
	newRemote := func(prefix string) (*s3store.Store, error) {
		c := awss3.New(srv.Client().Options(), s3store.ClientOptions)
		tmp, err := e.Mkdir("s3-spool")
		if err != nil {
			return nil, err
		}
		return s3store.New(s3store.Options{Client: c, Bucket: bucket, Prefix: prefix, TempDir: tmp})
	}

	// Seal of one 4 KiB change.
	src, err := e.Tree(ctx, 100)
	if err != nil {
		return err
	}
	plain, pnode, err := execDaemon(ctx, e, "local", src, func(*fabric.Options) {})
	if err != nil {
		return err
	}
	remote, err := newRemote("seal")
	if err != nil {
		return err
	}
	synced, snode, err := execDaemon(ctx, e, "s3-sync", src, func(o *fabric.Options) { o.Remote = remote })
	if err != nil {
		return err
	}
	rep, remoteSeals := 0, 0
	change := make([]byte, 4096)
	seal := func(d *bench.Daemon, node string) bench.Subject {
		return func(ctx context.Context) (bench.Measurement, error) {
			kids, err := d.Ops.Fork(ctx, node, 1)
			if err != nil {
				return bench.Measurement{}, err
			}
			aid, root, err := d.Ops.Activate(ctx, kids[0])
			if err != nil {
				return bench.Measurement{}, err
			}
			rep++
			if d == synced {
				remoteSeals++
			}
			copy(change, fmt.Sprintf("change %d\n", rep))
			if err := os.WriteFile(filepath.Join(root, "change.bin"), change, 0o644); err != nil {
				return bench.Measurement{}, err
			}
			return bench.Timed(1, func() error { _, err := d.Ops.Suspend(ctx, aid); return err })
		}
	}
	subjects := []bench.Subject{seal(plain, pnode), seal(synced, snode)}
	if _, err := bench.Interleave(ctx, 3, subjects...); err != nil {
		return err
	}
	ms, err := bench.Interleave(ctx, e.Size(15, 30), subjects...)
	if err != nil {
		return err
	}
	p, s := bench.Latencies(ms[0]), bench.Latencies(ms[1])
	puts := float64(remote.Stats().Puts.Load()) / float64(remoteSeals)
	e.Add(bench.Row{Name: "seal one 4 KiB change, sync remote durability (S3)", Value: s.P50, Unit: "ms", P90: s.P90, N: s.N, Samples: s.Values,
		Baseline: "the same seal, local only", BaselineValue: p.P50, Path: synced.Ops.Path("suspend"),
		Note: fmt.Sprintf("versitygw on loopback, posix backend on the same disk; %.1f PUTs per seal (the new blob and trees as one pack and its index)", puts)})

	// Restore throughput.
	store, err := newRemote("restore")
	if err != nil {
		return err
	}
	const blob = 4 << 20
	n := e.Size(16, 64)
	var ids []cas.ID
	buf := make([]byte, blob)
	for i := range n {
		copy(buf, fmt.Sprintf("restore blob %d\n", i))
		info, _, err := store.Put(ctx, bytes.NewReader(buf))
		if err != nil {
			return err
		}
		ids = append(ids, info.ID)
	}
	restore := func(ctx context.Context) (bench.Measurement, error) {
		dir, err := e.Mkdir("s3-restore")
		if err != nil {
			return bench.Measurement{}, err
		}
		l, err := local.Open(dir, nil)
		if err != nil {
			return bench.Measurement{}, err
		}
		ts, err := tier.New(tier.Options{Local: l, Remote: store})
		if err != nil {
			return bench.Measurement{}, err
		}
		m, err := bench.Timed(float64(n*blob), func() error {
			for _, id := range ids {
				if err := ts.Fetch(ctx, id); err != nil {
					return err
				}
			}
			return nil
		})
		os.RemoveAll(dir)
		return m, err
	}
	c := awss3.New(srv.Client().Options(), s3store.ClientOptions)
	getLoop := func(ctx context.Context) (bench.Measurement, error) {
		return bench.Timed(float64(n*blob), func() error {
			for _, id := range ids {
				out, err := c.GetObject(ctx, &awss3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(store.Prefix() + "o/" + id.String())})
				if err != nil {
					return err
				}
				_, err = io.Copy(io.Discard, out.Body)
				out.Body.Close()
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	ms, err = bench.Interleave(ctx, e.Size(3, 5), restore, getLoop)
	if err != nil {
		return err
	}
	r, g := bench.Rates(ms[0], 1<<20), bench.Rates(ms[1], 1<<20)
	e.Add(bench.Row{Name: fmt.Sprintf("restore %d x 4 MiB through an empty cache (S3)", n), Value: r.P50, Unit: "MiB/s", P90: r.P90, N: r.N, Samples: r.Values,
		Baseline: "plain GET loop to /dev/null", BaselineValue: g.P50, Path: "cas/tier",
		Note: "sequential fetches: GET, BLAKE3 verify, durable local write (fsync per object)"})
	return benchS3Cold(ctx, e, srv, bucket)
}

// benchS3Cold: activate + first read of one file in a big root through an
// empty cache (a new daemon on the journal of the one that imported it:
// the restore path, its projection server fetching from the bucket),
// against the same on a daemon whose cache holds the objects.
func benchS3Cold(ctx context.Context, e *bench.Env, srv *s3test.Server, bucket string) error {
	for _, kv := range append(srv.Env(), "AWS_EC2_METADATA_DISABLED=true") {
		k, v, _ := strings.Cut(kv, "=")
		old, had := os.LookupEnv(k)
		os.Setenv(k, v)
		e.Cleanup(func() error {
			if had {
				return os.Setenv(k, old)
			}
			return os.Unsetenv(k)
		})
	}
	url := srv.URL(bucket, "cold")
	u, err := s3store.ParseURL(url)
	if err != nil {
		return err
	}
	withRemote := func(journalFrom string) func(*fabric.Options) error {
		return func(o *fabric.Options) error {
			c, err := s3store.NewClient(ctx, u)
			if err != nil {
				return err
			}
			if o.Remote, err = s3store.New(s3store.Options{Client: c, Bucket: bucket, Prefix: "cold"}); err != nil {
				return err
			}
			if len(o.ProjectionCommand) > 0 {
				o.ProjectionCommand = append(o.ProjectionCommand, "--cas-remote="+url)
			}
			if journalFrom == "" {
				return nil
			}
			if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
				return err
			}
			out, err := exec.Command("cp", "-a", journalFrom, filepath.Join(o.StateDir, "journal")).CombinedOutput()
			if err != nil {
				return fmt.Errorf("copy journal: %v: %s", err, out)
			}
			return nil
		}
	}
	start := func(name, journalFrom string) (*bench.Daemon, error) {
		var cerr error
		d, err := e.StartDaemon(ctx, name, func(o *fabric.Options) { cerr = withRemote(journalFrom)(o) })
		if err == nil {
			err = cerr
		}
		return d, err
	}
	files := e.Size(10_000, 100_000)
	src, err := e.Tree(ctx, files)
	if err != nil {
		return err
	}
	// One file deep in the tree.
	var rel string
	filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.Count(p[len(src):], "/") >= 2 {
			rel = p[len(src)+1:]
			return filepath.SkipAll
		}
		return nil
	})
	if rel == "" {
		return fmt.Errorf("no file two levels deep in %s", src)
	}
	a, err := start("s3-import", "")
	if err != nil {
		return err
	}
	imp, err := a.Ops.Import(ctx, src)
	if err != nil {
		return err
	}
	g, err := a.Ops.CreateGroup(ctx, imp.RootID)
	if err != nil {
		return err
	}
	node := g.Node.NodeID
	if err := a.Close(); err != nil {
		return err
	}
	journal := filepath.Join(a.StateDir, "journal")
	read := func(d *bench.Daemon) (bench.Measurement, error) {
		var aid string
		m, err := bench.Timed(1, func() error {
			var root string
			var err error
			aid, root, err = d.Ops.Activate(ctx, node)
			if err != nil {
				return err
			}
			_, err = os.ReadFile(filepath.Join(root, rel))
			return err
		})
		if aid != "" {
			if rerr := d.Ops.Release(ctx, aid); err == nil {
				err = rerr
			}
		}
		return m, err
	}
	var fetched []float64
	cold := func(ctx context.Context) (bench.Measurement, error) {
		d, err := start("s3-cold", journal)
		if err != nil {
			return bench.Measurement{}, err
		}
		defer d.Close()
		m, err := read(d)
		// What the cache holds now: every object either process fetched.
		n := 0
		filepath.WalkDir(filepath.Join(d.StateDir, "cas", "objects"), func(_ string, de fs.DirEntry, err error) error {
			if err == nil && de.Type().IsRegular() {
				n++
			}
			return nil
		})
		fetched = append(fetched, float64(n))
		return m, err
	}
	w, err := start("s3-warm", journal)
	if err != nil {
		return err
	}
	if _, err := read(w); err != nil { // fills its cache
		return err
	}
	warm := func(ctx context.Context) (bench.Measurement, error) { return read(w) }
	ms, err := bench.Interleave(ctx, e.Size(5, 10), cold, warm)
	if err != nil {
		return err
	}
	c, h := bench.Latencies(ms[0]), bench.Latencies(ms[1])
	fsum := bench.Summarize(fetched)
	e.Add(bench.Row{Name: fmt.Sprintf("activate + first read of one file in a %d-file root, empty cache (S3)", files), Value: c.P50, Unit: "ms", P90: c.P90, N: c.N, Samples: c.Values,
		Baseline: "the same, warm cache", BaselineValue: h.P50, Path: w.Ops.Path("activate"),
		Note: fmt.Sprintf("a new daemon on the importer's journal (its start not timed, its projection server's start timed); its cache then holds %.0f objects (median): the trees on the path and the blob", fsum.P50)})
	return nil
}
