package etcd_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/etcd"
	"github.com/esf-dev/esf/journal/journaltest"
)

var prefixes atomic.Int64

// open returns a store on c under a prefix of its own, closed when t ends
// (journaltest closes the stores it opens itself).
func newStore(t *testing.T, c *etcdtest.Cluster, o journaltest.Options) *etcd.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := etcd.Open(ctx, etcd.Options{
		Endpoints: c.Endpoints(),
		Prefix:    fmt.Sprintf("test/%d", prefixes.Add(1)),
		Now:       o.Now,
		Failpoint: o.Failpoint,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func conformance(t *testing.T, members int) {
	c := etcdtest.Start(t, etcdtest.Options{Members: members})
	journaltest.Run(t, func(t *testing.T, o journaltest.Options) journal.Store {
		if o.Failpoint == nil {
			o.Failpoint = func(string) error { return nil }
		}
		return newStore(t, c, o)
	})
}

func TestConformance1Member(t *testing.T) { conformance(t, 1) }

func TestConformance3Members(t *testing.T) { conformance(t, 3) }
