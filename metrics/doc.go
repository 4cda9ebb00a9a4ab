// Package metrics exposes esfd's Prometheus metrics: live and queued
// attempts, operation latency histograms (fork, activate, seal, ...), the
// content store's objects and bytes, the FUSE projection's operation
// counts, and garbage collection.
//
// Gauges are read when scraped (GaugeFunc/CounterFunc over the daemon's own
// tallies), so nothing is updated on hot paths but the latency histogram.
// The projection runs in its own process; its counters are read from the
// stats file it serves at the mount root (fusefs.StatsName). Only cmd/esfd
// serves the registry; libraries never touch the global one.
package metrics
