// Package treediff compares, merges and patches stored trees. It knows only
// cas: fabric resolves nodes to root ids and hands them in.
//
// Diff walks two trees in lockstep, merging the sorted entry lists of each
// directory, and never reads a subtree whose id is the same on both sides,
// so its cost grows with the difference: one changed file costs two tree
// reads per directory on its path, whatever the size of the tree. Changes
// come in depth-first name order (a directory before its entries, entries
// by byte order), which is also the order hard-link groups are named in.
// Kinds: Added, Deleted, Modified (content; Meta tells which attributes
// changed too), TypeChanged, MetaChanged (attributes only: mode, owner,
// mtime, xattrs, link group). A directory is never Modified, its entries
// are; its attributes live in its own tree, so a directory's Change entry is
// enriched with them. An added or deleted directory is one change unless
// Options.Expand asks for every path below it, which Apply and Patch need.
// The root is the path "".
//
// Merge is a three-way merge at the path level. Every path (directories
// included, by their attributes) is merged on its own value: unchanged by
// every head, it keeps base's; changed by some heads in one identical way,
// it takes that change; changed in two different ways it conflicts. A
// directory deleted (or replaced by a non-directory) by one head deletes
// every path below it, so another head's change below it conflicts, on the
// changed path; something another head added below it conflicts too, on the
// topmost added path. Attribute and content changes to one file by two
// heads conflict (there is no attribute-level merge of one file). An mtime
// alone is not a change: heads that made the same change at different times
// (a directory both added entries to, one file written identically by two
// agents) agree and the later mtime wins; a head that only touched a path
// yields to one that changed it. Subtrees
// that are equal in base and every head, or changed by one head only (or
// identically by several), are taken by id without being read; only
// directories where heads changed different things are read and written.
// A conflict returns a *ConflictError listing every conflicting path and
// writes nothing: trees are encoded in memory and stored only once the
// whole merge is conflict-free.
//
// Hard links in merges: a tree names each group after its first member and
// stores the group's count on every member, so any membership change alters
// every member's entry. Two heads changing one group therefore conflict on
// its members, except when their member entries come out identical (two
// heads each adding a later-sorting link to one file). When two or more
// heads change link-group members, the merged tree's names and counts may
// be stale, and Merge recomputes them with cas.Builder (the trees this
// replaces stay unreferenced for GC). Finding out which heads touch link
// groups costs an expanded Diff of each head against base (stopping early),
// run only when two heads changed one directory differently; the recompute
// itself loads the whole merged tree, and runs only when two heads touch
// link groups. Limitation: a new link that sorts
// before the group's first member renames the group, so it conflicts with
// any other head's change to that group.
//
// Patch writes a git-style patch (see Patch for what git can and cannot
// carry); Apply replays Changes on a cas.Builder.
//
// Concurrency: every function works on the caller's goroutine with its own
// state, and may run concurrently with others on the same store. Callbacks
// run on the caller's goroutine. Cancellation is checked at every tree read
// (and, in Patch, every buffer of blob content).
package treediff
