// Package crashtest proves FR-03 end to end: every mutating operation of
// esfd is atomic under a real SIGKILL at each of its journal boundaries.
// It holds tests only; this file is the design note.
//
// Cases. TestMain builds esfd once. For every operation (a spec: request,
// preconditions, classifier, live checks) and every failpoint on its path,
// from failpoint.Names, one case runs:
//
//  1. Copy the template state (a group and nodes made once by a clean esfd,
//     then `esfd stop-all`, so the copy holds no live mount). Operations on
//     an attempt get it from a clean esfd on the copy, stopped again: the
//     attempt's overlay and the FUSE projection server stay mounted and
//     running, as across any daemon restart.
//  2. Start esfd with ESF_FAILPOINTS="<point>=crash@<k>" and send the
//     operation with a fixed Idempotency-Key over the unix socket. The reply
//     must be lost and esfd must die by SIGKILL; or, past the last
//     evaluation of the point, the operation completes (a control run).
//  3. Read a copy of the journal exactly as the crash left it, audit it and
//     classify the operation as absent or complete; anything else (the
//     classifier's error) is a partial operation. The audit is generic:
//     every index key and record agree, attempts and leases agree, the
//     event log is gapless and replays to the records (each record created
//     once, each node and attempt state chain ending in its state, one
//     backprop event per visit, one promotion event per generation).
//  4. Restart esfd without failpoints (it runs Recover), check the live
//     invariants through the API (an attempt holding a lease is mounted,
//     once, and usable; a seal left either no node and the attempt active
//     with exactly the files it had, or one node whose export equals them),
//     replay the key twice (replies byte-equal; for graph operations equal
//     to the stored result), compare GET /v1/events with the journal, stop
//     esfd and audit again: the operation must now be complete, once.
//
// Failpoints. Each "fabric.<op>.*" point runs at its first evaluation. The
// journal's run per Update: begin for every Update, before-commit and
// after-commit for those that write. So begin is swept at k = 1, 2, ...
// until a control run completes; before-commit up to begin's count (one
// control run if some Update writes nothing); after-commit exactly as often
// as before-commit crashed.
//
// Cost. A case is about three esfd starts, two or three journal reads and
// a teardown (2-4 s on 2 cores); specs run in parallel (-parallel), cases
// of one spec in sequence. Graph operations reuse the template's journal
// read as their "before".
//
// Cleanup. Each case's t.Cleanup kills its esfd by pid, unmounts every
// mount under the case directory deepest first (lazily only as a last
// resort, reported), which ends the projection server, then kills any
// process of our esfd binary still naming the case directory. TestMain
// fails the run if anything of the binary or under its work dir remains.
//
// The matrix (operation × failpoint@k → absent or complete, and what the
// restart and replays did) is logged by each top-level test.
// TestFR03_EveryMutationHasACrashCase fails when an operation declares
// failpoints but has no spec here; TestAuditCatchesPartialBatches proves the
// audit notices torn batches.
//
// Root, overlayfs and /dev/fuse are required (the tests skip with a
// message otherwise, fail under ESF_TEST_REQUIRE=all as in CI, and skip
// under -short); a failpoint endpoint that esfd does not serve fails. journal/pebble/crash_test.go already covers
// the journal's own atomicity with pebble's crashable in-memory vfs,
// including loss of unsynced data, which a SIGKILL cannot show (the page
// cache survives it); this package does not repeat it.
package crashtest
