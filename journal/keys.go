package journal

import (
	"bytes"
	"fmt"
	"strings"
	"time"
)

// Key layout. Every record is one small value under a readable prefix, and
// every relation is an empty-valued index key maintained in the same
// transaction as the record, so a listing is one prefix scan and a single
// operation never loads a whole group:
//
//	group/<group_id>                              Group
//	node/<node_id>                                Node
//	attempt/<attempt_id>                          Attempt
//	runtime/<attempt_id>                          AttemptRuntime (worker-local)
//	eval/<evaluation_id>                          Evaluation
//	lease/<lease_id>                              Lease
//	idem/<idempotency key>                        IdempotencyEntry
//	idem-part/<idempotency key>/<4 digits>        part of a large recorded result
//	counter/<name>                                8-byte big-endian uint64
//	idx/children/<parent_id>/<child_id>           node parentage
//	idx/group-nodes/<group_id>/<node_id>          nodes of a group
//	idx/node-attempts/<node_id>/<attempt_id>      attempts of a node
//	idx/node-evals/<node_id>/<evaluation_id>      evaluations of a node
//	idx/attempt-evals/<attempt_id>/<evaluation_id>
//	idx/node-leases/<node_id>/<lease_id>          live leases of a node
//	idx/lease-expiry/<16 hex ns>/<lease_id>       live leases by expiry
//	idx/idem-expiry/<16 hex ns>/<idempotency key> idempotency entries that expire
//	front/<door>/<id>                             a front door's own record (fabric/frontdoor.go)
//	store-redo/<object id>/<nonce>                a sealed object's bytes until the store flushes it (fabric/storeredo.go)
//
// Ids are time-ordered (see NewID), so each index lists in creation order.
// Keys under ReservedPrefix belong to the Store implementation.
const (
	prefixGroup        = "group/"
	prefixNode         = "node/"
	prefixAttempt      = "attempt/"
	prefixRuntime      = "runtime/"
	prefixEval         = "eval/"
	prefixLease        = "lease/"
	prefixIdem         = "idem/"
	prefixIdemPart     = "idem-part/"
	prefixCounter      = "counter/"
	prefixChildren     = "idx/children/"
	prefixGroupNodes   = "idx/group-nodes/"
	prefixNodeAttempts = "idx/node-attempts/"
	prefixNodeEvals    = "idx/node-evals/"
	prefixAttemptEvals = "idx/attempt-evals/"
	prefixNodeLeases   = "idx/node-leases/"
	prefixLeaseExpiry  = "idx/lease-expiry/"
	prefixIdemExpiry   = "idx/idem-expiry/"
)

func recordKey(prefix, id string) []byte { return []byte(prefix + id) }

func indexKey(prefix, owner, member string) []byte {
	return []byte(prefix + owner + "/" + member)
}

// expiryKey is the key of id in the expiry index under prefix: times sort
// as 16 hex digits, so a scan up to expiryKey(prefix, now, "") lists what
// has expired, soonest first.
func expiryKey(prefix string, t time.Time, id string) []byte {
	return []byte(fmt.Sprintf("%s%016x/%s", prefix, uint64(t.UnixNano()), id))
}

// scanExpired calls fn with the id and index key of every member of the
// expiry index under prefix that expired at or before now, soonest first.
// key is valid only during the call.
func scanExpired(r Reader, prefix string, now time.Time, fn func(id string, key []byte) error) error {
	end := PrefixEnd(expiryKey(prefix, now, ""))
	return r.Scan([]byte(prefix), end, func(k, _ []byte) error {
		rest := k[len(prefix):]
		i := bytes.IndexByte(rest, '/')
		if i < 0 {
			return fmt.Errorf("expiry index key %q: %w", k, ErrCorrupt)
		}
		return fn(string(rest[i+1:]), k)
	})
}

// PrefixEnd returns the smallest key greater than every key with prefix, for
// use as Scan's end; nil (no bound) if prefix is all 0xff bytes.
func PrefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// ScanPrefix scans every key that starts with prefix.
func ScanPrefix(r Reader, prefix []byte, fn func(key, value []byte) error) error {
	return r.Scan(prefix, PrefixEnd(prefix), fn)
}

// scanMembers lists the member ids of an index owner, in key (creation) order.
func scanMembers(r Reader, prefix, owner string, fn func(member string) error) error {
	p := prefix + owner + "/"
	return ScanPrefix(r, []byte(p), func(k, _ []byte) error {
		return fn(strings.TrimPrefix(string(k), p))
	})
}

func listMembers(r Reader, prefix, owner string) ([]string, error) {
	var ids []string
	err := scanMembers(r, prefix, owner, func(m string) error {
		ids = append(ids, m)
		return nil
	})
	return ids, err
}
