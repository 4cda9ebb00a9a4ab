// Package s3 is a cas.Store on an S3-compatible object store, through the
// AWS SDK for Go v2. It is the remote tier of content: every worker reaches
// it, and each worker's local store (cas/local) becomes a verified cache in
// front of it (cas/tier).
//
// Object layout under the bucket and prefix (see docs/s3.md):
//
//	<prefix>/o/<64 hex>          a loose object: its raw bytes
//	<prefix>/p/<64 hex>.pack     a pack: small objects' raw bytes, concatenated
//	<prefix>/p/<64 hex>.idx      its index; the name is the BLAKE3 of the index
//
// An index is "esfpack1" followed by one 48-byte entry per object, sorted by
// id: the id (32 bytes), then the offset and the size in the pack (8 bytes
// each, big-endian). Its name is the BLAKE3-256 of its bytes, so a loaded
// index is verified like an object; the pack's objects are verified one by
// one when read (every Get hashes what it serves).
//
// Writes never overwrite: every PUT carries If-None-Match: *, and a 412
// (the key exists) is success, because a key's content is fixed by its
// name. A plain Put stores its object loose. A batch (NewBatch) and Upload
// store objects below Options.PackThreshold in packs of up to
// Options.PackSize bytes, larger ones loose: one request per pack instead
// of one per file. A pack is visible only through its index, which is
// written after the pack, so a crash between the two leaves unreferenced
// bytes (Orphans lists them for GC) and never a partial object.
//
// Reads: the store keeps every index in memory (loaded on first need,
// reloaded when a lookup misses, so packs other writers add are found). A
// packed object is read with a ranged GET of its pack.
//
// Delete removes a loose object, and rewrites (repacks) a pack that holds
// the object without it: the new pack and index are written first, then
// the old index and the old pack are deleted. Repacks of one Store are
// serialized; the store assumes one process collects garbage at a time.
//
// Requests go through the SDK's standard retryer (exponential backoff with
// jitter on 5xx, throttling, timeouts and connection resets); a body that
// fails mid-read is not retried here: the caller sees the error, and the
// verified cache refetches. Request checksums are computed only when the
// operation requires them (RequestChecksumCalculation=WhenRequired), which
// third-party servers need.
package s3
