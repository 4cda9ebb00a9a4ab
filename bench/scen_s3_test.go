package bench_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

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
//     to io.Discard.

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
	return nil
}
