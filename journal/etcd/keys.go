package etcd

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/esf-dev/esf/journal"
)

// Key layout. Every key of a store lives under its cluster prefix P (for
// example "/esf/"), in two namespaces:
//
//	P j/<journal key>             the journal's keys (package journal's layout)
//	P j/sys/schema                schema version (journal.SchemaVersion)
//	P j/sys/ev/<8-byte seq>       the event log, indexed (Seq order)
//	P j/sys/evseq                 the last indexed Seq
//	P x/evq/<txid>/<6 digits>-<n> events committed, not indexed yet: one
//	                              transaction's events, in chunks of n
//	P x/tomb/<journal key>        a deleted key's tombstone: range guards
//	                              see deletions through it
//	P x/tombgc                    rewritten when the tombstones are cleared
//	P x/stage/<txid>/<6 digits>   a large transaction's writes, staged
//	P x/commit/<txid>             a large transaction published: its staged
//	                              writes are being rolled forward
//	P x/done/<minute>/<txid>      the outcome marker every commit writes
//	P x/abort/<minute>/<txid>     a commit its writer declared lost
//
// j/ holds exactly what the pebble store would hold, so a Scan never sees
// the store's machinery; x/ is the machinery.
type keys struct {
	p string // the cluster prefix, ending in "/"
}

func newKeys(prefix string) (keys, error) {
	clean := strings.Trim(prefix, "/")
	if clean == "" {
		return keys{}, fmt.Errorf("etcd journal: empty key prefix: %w", journal.ErrInvalidArgument)
	}
	for _, seg := range strings.Split(clean, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return keys{}, fmt.Errorf("etcd journal: key prefix %q: empty or dot segment: %w", prefix, journal.ErrInvalidArgument)
		}
	}
	for _, c := range clean {
		if c < 0x21 || c > 0x7e {
			return keys{}, fmt.Errorf("etcd journal: key prefix %q: want visible ASCII: %w", prefix, journal.ErrInvalidArgument)
		}
	}
	return keys{p: "/" + clean + "/"}, nil
}

// data is the etcd key of a journal key.
func (k keys) data(key string) string { return k.p + "j/" + key }

// dataEnd is the end of the journal namespace.
func (k keys) dataEnd() string { return k.p + "j0" }

// dataRange is [start, end) of journal keys as etcd keys; an empty end is
// the end of the namespace.
func (k keys) dataRange(start, end string) (string, string) {
	if end == "" {
		return k.data(start), k.dataEnd()
	}
	return k.data(start), k.data(end)
}

func (k keys) journalKey(etcdKey []byte) []byte { return etcdKey[len(k.p)+2:] }

func (k keys) tomb(key string) string { return k.p + "x/tomb/" + key }
func (k keys) tombEnd() string        { return k.p + "x/tomb0" }

// tombRange is dataRange's tombstones.
func (k keys) tombRange(start, end string) (string, string) {
	if end == "" {
		return k.tomb(start), k.tombEnd()
	}
	return k.tomb(start), k.tomb(end)
}

func (k keys) tombGC() string { return k.p + "x/tombgc" }

func (k keys) evqPrefix() string { return k.p + "x/evq/" }

// evq is the key of chunk i, of n events, of transaction txid's events:
// the count is in the key so that the log can be numbered from a listing
// of keys alone.
func (k keys) evq(txid string, i, n int) string {
	return fmt.Sprintf("%sx/evq/%s/%06d-%d", k.p, txid, i, n)
}

// parseEvq splits a pending-events key into its transaction, chunk number
// and event count.
func (k keys) parseEvq(key string) (txid string, i, n int, err error) {
	rest, ok := strings.CutPrefix(key, k.evqPrefix())
	txid, chunk, ok2 := strings.Cut(rest, "/")
	num, count, ok3 := strings.Cut(chunk, "-")
	i, err1 := strconv.Atoi(num)
	n, err2 := strconv.Atoi(count)
	if !ok || !ok2 || !ok3 || err1 != nil || err2 != nil || len(num) != 6 || txid == "" || n < 1 {
		return "", 0, 0, fmt.Errorf("etcd journal: pending events key %q: %w", key, journal.ErrCorrupt)
	}
	return txid, i, n, nil
}

func (k keys) stagePrefix(txid string) string  { return k.p + "x/stage/" + txid + "/" }
func (k keys) stage(txid string, i int) string { return fmt.Sprintf("%s%06d", k.stagePrefix(txid), i) }
func (k keys) stageRoot() string               { return k.p + "x/stage/" }

func (k keys) commitPrefix() string      { return k.p + "x/commit/" }
func (k keys) commit(txid string) string { return k.commitPrefix() + txid }
func (k keys) donePrefix() string        { return k.p + "x/done/" }
func (k keys) abortPrefix() string       { return k.p + "x/abort/" }
func (k keys) done(b bucket, txid string) string {
	return fmt.Sprintf("%s%012d/%s", k.donePrefix(), b, txid)
}
func (k keys) abort(b bucket, txid string) string {
	return fmt.Sprintf("%s%012d/%s", k.abortPrefix(), b, txid)
}

// bucket is the minute (of the wall clock) in which a commit was tried:
// outcome markers are cleared by whole old buckets.
type bucket int64

func bucketOf(t time.Time) bucket { return bucket(t.Unix() / 60) }

// prefixEnd is the end of the range of keys that start with p.
func prefixEnd(p string) string { return string(journal.PrefixEnd([]byte(p))) }
