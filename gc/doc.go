// Package gc removes unreachable objects from a content-addressed store
// while writers keep writing to it. It knows only cas: fabric decides what
// the roots are (canonical nodes, non-pruned nodes and their ancestors,
// leased nodes and their ancestors, evaluation evidence) and hands them in.
//
// Mark walks the trees reachable from the roots, each distinct tree once.
// Sweep lists the store once and deletes, in bounded batches with an
// optional pause between them, what is neither marked nor protected.
// Collect runs both under an Epoch of a Tracker, which is what makes a
// collection safe against concurrent writers.
//
// # The writers' contract
//
// A concurrent writer can reference an object the mark did not see: a new
// root committed after the roots were read, a blob that dedup found among
// the garbage, a subtree of a node pruned meanwhile. The design closes each
// way in:
//
//  1. Every store operation of every writer goes through one Tracker. While
//     an epoch is open it records every id a Put stores or finds (at the
//     Put reader's EOF, before any store can decide the object exists) and
//     every id passed to Has or Stat (before the store answers). Sweep
//     deletes through Tracker.DeleteUnless, which checks those records and
//     deletes under the same per-id lock: either the record comes first
//     and the object stays, or the deletion comes first and the writer's
//     Put, finding nothing, stores the object again.
//  2. Every piece of work that stores objects and then commits a root that
//     references them, or that references trees by id without a Put or Has
//     (fork, seal's unchanged directories, merge's heads), runs inside a
//     session: leave := tracker.Enter(deps...), with deps the roots it
//     builds on, and leave() once its root is committed or the work is
//     abandoned. Enter before checking that deps are not pruned.
//  3. Collect begins its epoch, waits for sessions older than the epoch to
//     leave (their objects may predate the recording; once they have left,
//     their roots are committed and the roots read next include them), then
//     reads the roots, then adds the deps of the sessions open at that
//     moment. A session that enters later checked its deps after the roots
//     were read, so its deps were live then (pruning never reverses) and
//     are marked.
//
// What the caller must not do: reference an id it obtained by other means
// (a Get, a cache, an id kept from an earlier session) in a new root unless
// it is under a dep of the current session or was Put or Has'd during it;
// reuse an old tree by id after only a Has of the tree (that protects the
// tree object, not what it references: make its root a dep instead); write
// outside the Tracker; run a collection through another Tracker on the same
// store. Reads are not recorded. Fork needs no session if it checks the
// parent is not pruned in the same journal transaction that commits the
// child: the child's root is the parent's, live either way.
//
// Cost: the epoch's record holds every id writers touched during the
// collection, and Puts during an epoch hash their content a second time.
// Collect waits for sessions older than it, so a long import delays a
// collection's start (never the other way round: writers never wait for
// the collector, except for one object's deletion on the same lock stripe).
// Sweep keeps the list of candidates in memory, Mark one entry per tree.
//
// Reports: Deleted and BytesReclaimed count what the store held right
// before each deletion, so a dry run reports what a real run would reclaim
// if nothing changed meanwhile.
package gc
