package crashtest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/esf-dev/esf/journal"
)

// snapshot is every record of a journal, read with esfd stopped (or dead).
type snapshot struct {
	groups   map[string]journal.Group
	nodes    map[string]journal.Node
	attempts map[string]journal.Attempt
	runtimes map[string]journal.AttemptRuntime
	evals    map[string]journal.Evaluation
	leases   map[string]journal.Lease
	idem     map[string]journal.IdempotencyEntry
	counters map[string]uint64
	index    map[string]bool // every idx/ key
	events   []journal.Event
	// storeRedo holds the object ids of the seals' redo records
	// (store-redo/, fabric/storeredo.go).
	storeRedo map[string]bool
}

// readJournal reads the pebble journal of state (through a copy in
// scratch, see journalMode.read).
func readJournal(state, scratch string) (*snapshot, error) {
	return pebbleMode.read(state, "", scratch)
}

// readStore reads every record of s.
func readStore(s journal.Store) (*snapshot, error) {
	snap := &snapshot{
		groups: map[string]journal.Group{}, nodes: map[string]journal.Node{}, attempts: map[string]journal.Attempt{},
		runtimes: map[string]journal.AttemptRuntime{}, evals: map[string]journal.Evaluation{},
		leases: map[string]journal.Lease{}, idem: map[string]journal.IdempotencyEntry{},
		counters: map[string]uint64{}, index: map[string]bool{}, storeRedo: map[string]bool{},
	}
	err := s.View(context.Background(), func(r journal.Reader) error {
		// Records are read through the journal's own getters, which decode
		// strictly and validate: a torn or half-written value fails here.
		each := func(prefix string, get func(id string) error) error {
			return journal.ScanPrefix(r, []byte(prefix), func(k, _ []byte) error {
				return get(strings.TrimPrefix(string(k), prefix))
			})
		}
		if err := firstErr(
			each("group/", func(id string) (err error) { snap.groups[id], err = journal.GetGroup(r, id); return }),
			each("node/", func(id string) (err error) { snap.nodes[id], err = journal.GetNode(r, id); return }),
			each("attempt/", func(id string) (err error) { snap.attempts[id], err = journal.GetAttempt(r, id); return }),
			each("runtime/", func(id string) (err error) { snap.runtimes[id], err = journal.GetAttemptRuntime(r, id); return }),
			each("eval/", func(id string) (err error) { snap.evals[id], err = journal.GetEvaluation(r, id); return }),
			each("lease/", func(id string) (err error) { snap.leases[id], err = journal.GetLease(r, id); return }),
		); err != nil {
			return err
		}
		if err := each("idem/", func(key string) error {
			e, err := journal.GetIdempotency(r, key)
			snap.idem[key] = e
			return err
		}); err != nil {
			return err
		}
		if err := journal.ScanPrefix(r, []byte("counter/"), func(k, v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("counter %q: %d bytes", k, len(v))
			}
			snap.counters[strings.TrimPrefix(string(k), "counter/")] = binary.BigEndian.Uint64(v)
			return nil
		}); err != nil {
			return err
		}
		if err := journal.ScanPrefix(r, []byte("idx/"), func(k, _ []byte) error {
			snap.index[string(k)] = true
			return nil
		}); err != nil {
			return err
		}
		if err := journal.ScanPrefix(r, []byte(storeRedoPrefix), func(k, _ []byte) error {
			id, _, _ := strings.Cut(strings.TrimPrefix(string(k), storeRedoPrefix), "/")
			snap.storeRedo[id] = true
			return nil
		}); err != nil {
			return err
		}
		return r.Events(0, func(ev journal.Event) error {
			snap.events = append(snap.events, ev)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	return snap, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func idx(kind, owner, member string) string { return "idx/" + kind + "/" + owner + "/" + member }

func expiryIdx(l journal.Lease) string {
	return fmt.Sprintf("idx/lease-expiry/%016x/%s", uint64(l.ExpiresAt.UnixNano()), l.LeaseID)
}

// audit checks that the journal is whole: every record's index keys exist
// and every index key names records that agree with it; groups, nodes,
// attempts, leases and evaluations reference each other consistently; and
// the event log is gapless and replays to the records (each record was
// created once, each state chain of events ends in the record's state).
// One partially applied batch breaks at least one of these.
func (s *snapshot) audit() []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	want := func(key string) {
		if !s.index[key] {
			fail("index key %s missing", key)
		}
	}

	for id, g := range s.groups {
		for _, n := range []string{g.RootNodeID, g.CanonicalNodeID} {
			if node, ok := s.nodes[n]; !ok || node.GroupID != id {
				fail("group %s names node %s, which is missing or in another group", id, n)
			}
		}
		if c, ok := s.nodes[g.CanonicalNodeID]; ok && c.Status != journal.NodeSealed && c.Status != journal.NodeTerminal {
			fail("group %s: canonical node %s is %s", id, c.NodeID, c.Status)
		}
	}
	for id, n := range s.nodes {
		if _, ok := s.groups[n.GroupID]; !ok {
			fail("node %s: group %s missing", id, n.GroupID)
		}
		want(idx("group-nodes", n.GroupID, id))
		for _, p := range n.Parents {
			pn, ok := s.nodes[p]
			if !ok || pn.GroupID != n.GroupID {
				fail("node %s: parent %s missing or in another group", id, p)
			}
			want(idx("children", p, id))
			if ok && n.Status == journal.NodeDraft && len(n.Parents) == 1 && n.RootID != pn.RootID {
				fail("draft %s: root %s is not its parent's %s", id, n.RootID, pn.RootID)
			}
		}
	}
	for id, a := range s.attempts {
		if n, ok := s.nodes[a.NodeID]; !ok || n.GroupID != a.GroupID {
			fail("attempt %s: node %s missing or in another group", id, a.NodeID)
		}
		want(idx("node-attempts", a.NodeID, id))
		if a.ResultNodeID != "" {
			if _, ok := s.nodes[a.ResultNodeID]; !ok {
				fail("attempt %s: result node %s missing", id, a.ResultNodeID)
			}
		}
		l, leased := s.leases[a.LeaseID]
		switch a.State {
		case journal.AttemptActive, journal.AttemptQuiescing:
			if !leased {
				fail("attempt %s is %s without its lease %q", id, a.State, a.LeaseID)
			}
		case journal.AttemptFailed, journal.AttemptReleased:
			if leased {
				fail("attempt %s is %s but its lease %s is live", id, a.State, a.LeaseID)
			}
		case journal.AttemptQueued:
			if a.LeaseID != "" {
				fail("queued attempt %s has lease %s", id, a.LeaseID)
			}
		}
		if leased && (l.AttemptID != id || l.NodeID != a.NodeID) {
			fail("attempt %s: lease %s belongs to attempt %s on node %s", id, l.LeaseID, l.AttemptID, l.NodeID)
		}
	}
	for id := range s.runtimes {
		a, ok := s.attempts[id]
		if !ok {
			fail("runtime record of missing attempt %s", id)
		} else if a.State == journal.AttemptFailed || a.State == journal.AttemptReleased {
			fail("attempt %s is %s but keeps a runtime record", id, a.State)
		}
	}
	for id, e := range s.evals {
		n, ok := s.nodes[e.NodeID]
		if !ok || n.GroupID != e.GroupID {
			fail("evaluation %s: node %s missing or in another group", id, e.NodeID)
		} else if n.Status == journal.NodeDraft {
			fail("evaluation %s of draft %s", id, e.NodeID)
		}
		want(idx("node-evals", e.NodeID, id))
		if e.AttemptID != "" {
			if _, ok := s.attempts[e.AttemptID]; !ok {
				fail("evaluation %s: attempt %s missing", id, e.AttemptID)
			}
			want(idx("attempt-evals", e.AttemptID, id))
		}
	}
	for id, l := range s.leases {
		a, ok := s.attempts[l.AttemptID]
		if !ok || a.LeaseID != id {
			fail("lease %s: attempt %s missing or holds another lease", id, l.AttemptID)
		} else if a.State != journal.AttemptActive && a.State != journal.AttemptQuiescing && a.State != journal.AttemptSealed {
			fail("lease %s held by %s attempt %s", id, a.State, a.AttemptID)
		}
		want(idx("node-leases", l.NodeID, id))
		want(expiryIdx(l))
		if l.Token > s.counters["lease-token"] {
			fail("lease %s: token %d above the fencing counter %d", id, l.Token, s.counters["lease-token"])
		}
	}
	for k := range s.index {
		parts := strings.Split(strings.TrimPrefix(k, "idx/"), "/")
		if len(parts) != 3 {
			fail("malformed index key %s", k)
			continue
		}
		kind, owner, member := parts[0], parts[1], parts[2]
		switch kind {
		case "children":
			if c, ok := s.nodes[member]; !ok || !slices.Contains(c.Parents, owner) {
				fail("index %s: child missing or not a child of %s", k, owner)
			}
		case "group-nodes":
			if n, ok := s.nodes[member]; !ok || n.GroupID != owner {
				fail("index %s: node missing or in another group", k)
			}
		case "node-attempts":
			if a, ok := s.attempts[member]; !ok || a.NodeID != owner {
				fail("index %s: attempt missing or on another node", k)
			}
		case "node-evals":
			if e, ok := s.evals[member]; !ok || e.NodeID != owner {
				fail("index %s: evaluation missing or of another node", k)
			}
		case "attempt-evals":
			if e, ok := s.evals[member]; !ok || e.AttemptID != owner {
				fail("index %s: evaluation missing or of another attempt", k)
			}
		case "node-leases":
			if l, ok := s.leases[member]; !ok || l.NodeID != owner {
				fail("index %s: lease missing or on another node", k)
			}
		case "lease-expiry":
			if l, ok := s.leases[member]; !ok || expiryIdx(l) != k {
				fail("index %s: lease missing or expiring at another time", k)
			}
		default:
			fail("unknown index key %s", k)
		}
	}
	bad = append(bad, s.auditEvents()...)
	return bad
}

// stateChange is the {"from","to"} of a state event.
type stateChange struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// auditEvents checks that the log is exactly the history of the records.
func (s *snapshot) auditEvents() []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	created := map[string]int{}         // record id → creation events
	chain := map[string][]stateChange{} // node or attempt id → its state events in order
	initial := map[string]string{}      // node id → status it was created with
	promotions := map[string][]string{} // group id → canonical node of each promotion
	backprops := map[string]uint64{}
	evals := map[string]int{} // node id → evaluation.created events
	acquired := map[string]int{}
	ended := map[string]int{} // lease id → released or expired events
	for i, ev := range s.events {
		if ev.Seq != uint64(i+1) {
			fail("event %d has seq %d: the log has a gap", i+1, ev.Seq)
			break
		}
		if ev.GroupID != "" && s.groups[ev.GroupID].GroupID == "" {
			fail("event %d %s names missing group %s", ev.Seq, ev.Type, ev.GroupID)
		}
		if ev.NodeID != "" && s.nodes[ev.NodeID].NodeID == "" {
			fail("event %d %s names missing node %s", ev.Seq, ev.Type, ev.NodeID)
		}
		if ev.AttemptID != "" && s.attempts[ev.AttemptID].AttemptID == "" {
			fail("event %d %s names missing attempt %s", ev.Seq, ev.Type, ev.AttemptID)
		}
		var sc stateChange
		switch ev.Type {
		case journal.EventGroupCreated:
			created[ev.GroupID]++
		case journal.EventGroupPromoted:
			promotions[ev.GroupID] = append(promotions[ev.GroupID], ev.NodeID)
		case journal.EventNodeForked:
			created[ev.NodeID]++
			initial[ev.NodeID] = string(journal.NodeDraft)
		case journal.EventNodeState:
			_ = json.Unmarshal(ev.Data, &sc)
			chain[ev.NodeID] = append(chain[ev.NodeID], sc)
		case journal.EventNodeBackprop:
			backprops[ev.NodeID]++
		case journal.EventAttemptCreated:
			created[ev.AttemptID]++
		case journal.EventAttemptState:
			_ = json.Unmarshal(ev.Data, &sc)
			chain[ev.AttemptID] = append(chain[ev.AttemptID], sc)
		case journal.EventEvaluationCreated:
			evals[ev.NodeID]++
		case journal.EventLeaseAcquired:
			acquired[ev.LeaseID]++
		case journal.EventLeaseReleased, journal.EventLeaseExpired:
			ended[ev.LeaseID]++
		default:
			// Every other node event creates a sealed node: node.created
			// (a group's root), node.sealed (a seal's child), node.merged.
			if strings.HasPrefix(ev.Type, "node.") {
				created[ev.NodeID]++
				initial[ev.NodeID] = string(journal.NodeSealed)
			}
		}
	}
	follow := func(what, id, start, current string) {
		at := start
		for i, sc := range chain[id] {
			if sc.From != at {
				fail("%s %s: state event %d goes from %q, but it was %q", what, id, i+1, sc.From, at)
			}
			at = sc.To
		}
		if at != current {
			fail("%s %s is %s, but its events leave it %s", what, id, current, at)
		}
	}
	for id, g := range s.groups {
		if created[id] != 1 {
			fail("group %s has %d creation events", id, created[id])
		}
		p := promotions[id]
		if uint64(len(p))+1 != g.Generation {
			fail("group %s at generation %d has %d promotion events", id, g.Generation, len(p))
		}
		if len(p) > 0 && p[len(p)-1] != g.CanonicalNodeID {
			fail("group %s: last promotion event names %s, canonical is %s", id, p[len(p)-1], g.CanonicalNodeID)
		}
	}
	nodeEvals := map[string]int{}
	for _, e := range s.evals {
		nodeEvals[e.NodeID]++
	}
	for id, n := range s.nodes {
		if created[id] != 1 {
			fail("node %s has %d creation events", id, created[id])
			continue
		}
		follow("node", id, initial[id], string(n.Status))
		if backprops[id] != n.Visits {
			fail("node %s has %d visits and %d backprop events", id, n.Visits, backprops[id])
		}
		if evals[id] != nodeEvals[id] {
			fail("node %s has %d evaluations and %d evaluation events", id, nodeEvals[id], evals[id])
		}
	}
	for id, a := range s.attempts {
		if created[id] != 1 {
			fail("attempt %s has %d creation events", id, created[id])
			continue
		}
		start := string(journal.AttemptQueued)
		if c := chain[id]; len(c) > 0 && c[0].From == string(journal.AttemptActive) || len(c) == 0 && a.State == journal.AttemptActive {
			start = string(journal.AttemptActive) // created active, before queueing existed
		}
		follow("attempt", id, start, string(a.State))
		if a.LeaseID == "" {
			continue
		}
		if acquired[a.LeaseID] != 1 {
			fail("lease %s of attempt %s acquired by %d events", a.LeaseID, id, acquired[a.LeaseID])
		}
		_, live := s.leases[a.LeaseID]
		switch {
		case live && ended[a.LeaseID] != 0:
			fail("lease %s is live but has %d release or expiry events", a.LeaseID, ended[a.LeaseID])
		case !live && ended[a.LeaseID] != 1:
			fail("lease %s is gone with %d release or expiry events", a.LeaseID, ended[a.LeaseID])
		}
	}
	return bad
}

// eventsWithKey lists the types of the events appended under key, in order.
func (s *snapshot) eventsWithKey(key string) []string {
	var out []string
	for _, ev := range s.events {
		if ev.IdempotencyKey == key {
			out = append(out, ev.Type)
		}
	}
	return out
}

// newIDs lists the keys of after that before lacks, sorted.
func newIDs[V any](before, after map[string]V) []string {
	var out []string
	for id := range after {
		if _, ok := before[id]; !ok {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}
