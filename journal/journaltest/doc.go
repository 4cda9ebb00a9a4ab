// Package journaltest is the conformance suite every journal.Store passes:
// the key-value contract (read-your-writes, snapshot reads, atomic and
// serialisable updates, limits, cancellation, close), the event log and its
// notification, the journal failpoints, and the record, index and
// idempotency helpers of package journal run against the store, so a store
// whose scans or batches misbehave fails there too.
//
// Run it from the implementation's tests:
//
//	func TestConformance(t *testing.T) {
//		journaltest.Run(t, func(t *testing.T, o journaltest.Options) journal.Store {
//			return mem.New(mem.Options{Now: o.Now, Failpoint: o.Failpoint})
//		})
//	}
package journaltest
