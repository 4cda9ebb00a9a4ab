// Package proctest supervises a server process that a test harness starts
// and may kill and start again on the same data (an etcd member for
// internal/etcdtest, versitygw for internal/s3test): its own process
// group, killed with the test process, its output appended to a log file
// across restarts.
package proctest
