// Package mem is an in-memory journal.Store: the fake that fabric's unit
// tests use, held to the same journaltest suite as the pebble store. It is
// not durable.
//
// Data is a sorted slice of keys plus a map of values. A View holds a read
// lock for its whole duration, which is its snapshot; an Update holds the
// writer lock, buffers its writes in an overlay that its own reads consult
// first, and takes the write lock only to apply the overlay at commit, so
// Views run alongside a transaction but never see half of one. Scans inside
// an Update merge the overlay as it was when the scan began.
//
// Like the pebble store, Update evaluates the journal failpoints through
// Options.Failpoint, so operations can be fault-tested on the fake too.
package mem
