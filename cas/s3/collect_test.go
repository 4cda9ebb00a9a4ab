package s3_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/esf-dev/esf/cas"
	s3store "github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/internal/s3test"
)

// Collect deletes dead loose objects, rewrites a pack below the live ratio
// with its live objects, deletes orphaned pack data, keeps what a writer
// recorded (Guard's keep) and everything younger than the grace period.
func TestCollect(t *testing.T) {
	ctx := context.Background()
	srv := s3test.Start(t)
	st := newStore(t, srv, s3store.Options{})
	b := st.NewBatch()
	var small []cas.ID
	for i := range 10 {
		info, _, err := b.Put(ctx, bytes.NewReader(bytes.Repeat([]byte{byte(i)}, 1000)))
		if err != nil {
			t.Fatal(err)
		}
		small = append(small, info.ID)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var large []cas.ID
	for i := range 3 {
		info, _, err := st.Put(ctx, bytes.NewReader(bytes.Repeat([]byte{'L', byte(i)}, 300<<10)))
		if err != nil {
			t.Fatal(err)
		}
		large = append(large, info.ID)
	}
	orphan := st.Prefix() + "p/" + strings.Repeat("ab", 32) + ".pack"
	if _, err := srv.Client().PutObject(ctx, &awss3.PutObjectInput{Bucket: aws.String(st.bucket), Key: aws.String(orphan), Body: bytes.NewReader([]byte("dead bytes"))}); err != nil {
		t.Fatal(err)
	}
	live := map[cas.ID]bool{small[0]: true, small[1]: true, small[2]: true, large[0]: true}
	protected := large[1] // a writer recorded it since the mark
	opts := s3store.CollectOptions{
		Live: func(id cas.ID) bool { return live[id] },
		Guard: func(ids []cas.ID, fn func(func(cas.ID) bool) error) error {
			return fn(func(id cas.ID) bool { return id == protected })
		},
	}
	// Everything is young: nothing goes.
	rep, err := st.Collect(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Deleted != 0 || rep.Orphans != 0 || rep.KeptYoung == 0 {
		t.Fatalf("collect within the grace period: %+v", rep)
	}
	opts.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	opts.DryRun = true
	if rep, err = st.Collect(ctx, opts); err != nil || rep.Deleted != 8 {
		t.Fatalf("dry run: %+v, %v; want 8 to delete (7 small, 1 large)", rep, err)
	}
	if n := len(listAll(t, st)); n != 13 {
		t.Fatalf("dry run deleted something: %d objects left", n)
	}
	opts.DryRun = false
	rep, err = st.Collect(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Deleted != 8 || rep.PacksRewritten != 1 || rep.Orphans != 1 {
		t.Fatalf("collect: %+v, want 8 deleted, 1 pack rewritten, 1 orphan", rep)
	}
	left := listAll(t, st)
	for _, id := range append(append([]cas.ID{}, small...), large...) {
		want := live[id] || id == protected
		if _, ok := left[id]; ok != want {
			t.Fatalf("object %s present %v after collect, want %v", id.Short(), ok, want)
		}
		if want {
			if _, err := cas.ReadAll(ctx, st, id); err != nil {
				t.Fatalf("kept object %s: %v", id.Short(), err)
			}
		}
	}
	if o, err := st.Orphans(ctx); err != nil || len(o) != 0 {
		t.Fatalf("orphans after collect: %v, %v", o, err)
	}
}

func listAll(t *testing.T, st harness) map[cas.ID]int64 {
	t.Helper()
	m := map[cas.ID]int64{}
	if err := st.Walk(context.Background(), func(info cas.Info) error { m[info.ID] = info.Size; return nil }); err != nil {
		t.Fatal(err)
	}
	return m
}
