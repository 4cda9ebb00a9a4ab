package crashtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/journal"
	jetcd "github.com/esf-dev/esf/journal/etcd"
	jpebble "github.com/esf-dev/esf/journal/pebble"
)

// journalMode is where the esfd of a matrix keeps its journal: pebble in
// the state dir (the default), or etcd, under a key prefix of its own per
// case on the one cluster TestMain starts.
type journalMode struct {
	name    string
	cluster *etcdtest.Cluster // etcd only
}

var pebbleMode = &journalMode{name: "pebble"}

// etcdCluster serves every etcd-mode case of the run; etcdMissing says why
// there is none (the etcd tests skip or fail with it).
var (
	etcdCluster *etcdtest.Cluster
	etcdMissing error
)

func etcdMode() *journalMode { return &journalMode{name: "etcd", cluster: etcdCluster} }

// args are esfd's flags for the journal under prefix.
func (m *journalMode) args(prefix string) []string {
	if m.cluster == nil {
		return nil
	}
	// A worker lease long enough that a daemon starved of CPU on a loaded
	// machine keeps it (with 3 s, one at load ~20 lost it, was fenced and
	// stopped its sandboxes, and the case failed for a reason of the
	// machine). It costs the matrix nothing: an esfd restarted after a
	// SIGKILL on the same state dir takes its registration back at once
	// (journal/etcd Register, Worker.State) instead of waiting out the
	// killed one's lease.
	return []string{"--journal", m.cluster.URL(prefix), "--worker-ttl", "15s"}
}

// open opens the journal of state (pebble, in dir) or prefix (etcd).
func (m *journalMode) open(dir, prefix string) (journal.Store, error) {
	if m.cluster == nil {
		return jpebble.Open(dir, jpebble.Options{})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// No maintenance: a reader must not compact what esfd might read.
	return jetcd.Open(ctx, jetcd.Options{Endpoints: m.cluster.Endpoints(), Prefix: prefix, CompactEvery: -1})
}

// read reads and returns the journal as esfd left it. pebble: with a
// scratch dir, a copy (opening a pebble store replays its WAL and
// rewrites its files, and esfd must restart on exactly what a crash
// left). etcd: in place; reading changes nothing a reader can tell (it
// may finish rolling a published transaction forward, or index pending
// events, as esfd's next reader would).
func (m *journalMode) read(state, prefix, scratch string) (*snapshot, error) {
	dir := filepath.Join(state, "journal")
	if m.cluster == nil && scratch != "" {
		if err := os.RemoveAll(scratch); err != nil {
			return nil, err
		}
		if out, err := exec.Command("cp", "-a", dir, scratch).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("copy journal: %v: %s", err, out)
		}
		defer os.RemoveAll(scratch)
		dir = scratch
	}
	s, err := m.open(dir, prefix)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return readStore(s)
}

// exists reports whether state has a journal to tear down attempts of.
func (m *journalMode) exists(state string) bool {
	return m.cluster != nil || exists(filepath.Join(state, "journal"))
}

// copy makes the case's journal a copy of the template's. etcd: the
// template's pending events are indexed first, so the copy (whose keys
// get new revisions) holds the log in its order; then every journal key
// is copied, a hundred per transaction.
func (m *journalMode) copy(from, to string) error {
	if m.cluster == nil {
		return nil // the state dir copy holds it
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := jetcd.Open(ctx, jetcd.Options{Endpoints: m.cluster.Endpoints(), Prefix: from, CompactEvery: -1})
	if err != nil {
		return err
	}
	err = s.FlushEvents(ctx)
	s.Close()
	if err != nil {
		return err
	}
	cli, err := m.cluster.NewClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	src, dst := "/"+from+"/j/", "/"+to+"/j/"
	resp, err := cli.Get(ctx, src, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	var ops []clientv3.Op
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		_, err := cli.Txn(ctx).Then(ops...).Commit()
		ops = ops[:0]
		return err
	}
	for _, kv := range resp.Kvs {
		ops = append(ops, clientv3.OpPut(dst+strings.TrimPrefix(string(kv.Key), src), string(kv.Value)))
		if len(ops) == 100 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}
