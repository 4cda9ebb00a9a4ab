package e2b

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/journal"
)

// State: what E2B has and esf has not is kept durably in the fabric's
// journal as front-door records (fabric.PutFrontRecord, under
// front/e2b/), so a restarted esfd (SIGTERM or SIGKILL) serves the same
// sandboxes:
//   - sbx-ID: a sandbox: its template, metadata, envVars, timeout, the
//     live attempt (running) or the sealed node (paused), and the SHA-256
//     of its access tokens (never a token);
//   - snap-NODE: a snapshot: the sandbox it was taken of and its names.
//
// A record is written after the fabric call it describes succeeded. At
// start, Restore reads them back: a running sandbox whose attempt is
// still live (the fabric adopts its container) runs on, its timer armed
// again; one whose attempt ended while esfd was down (its lease expired)
// is dropped; a paused one is its node again; a snapshot whose node was
// pruned is dropped. Commands do not survive a restart, and neither do
// the remembered Idempotency-Key answers.
//
// Access tokens: only their SHA-256 is recorded, so envd calls with the
// token an SDK already holds keep working after a restart. The token
// itself is gone with the process: the next connect (or get info) of the
// sandbox mints a new one, accepted beside the old, and answers it, as
// E2B's connect does; a signed file URL made with the old token no longer
// verifies (its signature needs the token itself).

// frontDoor names the front door's records in the journal.
const frontDoor = "e2b"

// maxTokens bounds the access tokens a sandbox accepts (one minted per
// restart at most; the oldest go first).
const maxTokens = 4

// sandboxRecord is a sandbox's durable record.
type sandboxRecord struct {
	SandboxID  string            `json:"sandbox_id"`
	TemplateID string            `json:"template_id"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// Env holds the envVars' values: a resumed sandbox gets them again
	// (like an attempt's runtime record, it is never exported nor part of
	// any provenance).
	Env       map[string]string `json:"env,omitempty"`
	AutoPause bool              `json:"auto_pause,omitempty"`
	StartedAt time.Time         `json:"started_at"`
	EndAt     time.Time         `json:"end_at"`
	// AttemptID is the running sandbox's attempt, PausedNodeID the node a
	// pause sealed: exactly one is set.
	AttemptID    string `json:"attempt_id,omitempty"`
	PausedNodeID string `json:"paused_node_id,omitempty"`
	// TokenSHA256 are the hex SHA-256 digests of the accepted access
	// tokens, oldest first.
	TokenSHA256 []string `json:"token_sha256"`
}

// snapshotRecordJSON is a snapshot's durable record.
type snapshotRecordJSON struct {
	SandboxID string   `json:"sandbox_id"`
	Names     []string `json:"names"`
}

func tokenHash(tok string) [32]byte { return sha256.Sum256([]byte(tok)) }

// setToken makes tok sb's token (the one its replies carry), accepted
// beside the older ones. Caller holds s.mu.
func (sb *sandbox) setToken(tok string) {
	sb.token = tok
	sb.tokens = append(sb.tokens, tokenHash(tok))
	if len(sb.tokens) > maxTokens {
		sb.tokens = sb.tokens[len(sb.tokens)-maxTokens:]
	}
}

// tokenOK checks an envd call's access token against sb's, in constant
// time.
func (s *Server) tokenOK(sb *sandbox, tok string) bool {
	h := tokenHash(tok)
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := 0
	for _, t := range sb.tokens {
		ok |= subtle.ConstantTimeCompare(h[:], t[:])
	}
	return ok == 1
}

// record describes sb; caller holds s.mu.
func (sb *sandbox) record() sandboxRecord {
	r := sandboxRecord{SandboxID: sb.id, TemplateID: sb.templateID, Metadata: sb.metadata, Env: sb.env,
		AutoPause: sb.autoPause, StartedAt: sb.startedAt, EndAt: sb.endAt, PausedNodeID: sb.paused,
		TokenSHA256: make([]string, len(sb.tokens))}
	if sb.paused == "" {
		r.AttemptID = sb.attempt.AttemptID
	}
	for i, t := range sb.tokens {
		r.TokenSHA256[i] = hex.EncodeToString(t[:])
	}
	return r
}

// persist writes sb's record as it is now. Once sb is gone it writes
// nothing and answers not found: a call that looked sb up before a kill
// must not bring its record back (a restart would serve the killed
// sandbox again), nor a resume start it again.
func (s *Server) persist(ctx context.Context, sb *sandbox) error {
	sb.rec.Lock()
	defer sb.rec.Unlock()
	s.mu.Lock()
	if sb.gone {
		s.mu.Unlock()
		return notFound(sb.id)
	}
	rec := sb.record()
	s.mu.Unlock()
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := s.f.PutFrontRecord(context.WithoutCancel(ctx), frontDoor, "sbx-"+sb.id, b); err != nil {
		return fmt.Errorf("record sandbox %s: %w", sb.id, err)
	}
	return nil
}

// persistLogged is persist for a change already made in the fabric: a
// failure is logged (after a restart the sandbox is then as its last
// record says, or dropped if that names an ended attempt).
func (s *Server) persistLogged(ctx context.Context, sb *sandbox) {
	if err := s.persist(ctx, sb); err != nil && !s.isGone(sb) {
		s.log.Warn("e2b: record a sandbox", "sandbox", sb.id, "err", err)
	}
}

// isGone reports whether sb was killed or ended.
func (s *Server) isGone(sb *sandbox) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sb.gone
}

// forgetSandbox deletes the record of sb, which is gone.
func (s *Server) forgetSandbox(ctx context.Context, sb *sandbox) {
	sb.rec.Lock()
	defer sb.rec.Unlock()
	s.forgetRecord(ctx, sb.id)
}

// forgetRecord deletes sandbox id's record.
func (s *Server) forgetRecord(ctx context.Context, id string) {
	if err := s.f.DeleteFrontRecord(context.WithoutCancel(ctx), frontDoor, "sbx-"+id); err != nil {
		s.log.Warn("e2b: delete a sandbox's record", "sandbox", id, "err", err)
	}
}

func (s *Server) persistSnapshot(ctx context.Context, node string, rec snapshotRecord) error {
	b, err := json.Marshal(snapshotRecordJSON{SandboxID: rec.sandboxID, Names: rec.names})
	if err != nil {
		return err
	}
	return s.f.PutFrontRecord(context.WithoutCancel(ctx), frontDoor, "snap-"+node, b)
}

// ensureToken gives sb a token its replies can carry: after a restart
// only the digests of its old ones are known, so a new one is minted
// and recorded.
func (s *Server) ensureToken(ctx context.Context, sb *sandbox) error {
	s.mu.Lock()
	if sb.token != "" {
		s.mu.Unlock()
		return nil
	}
	sb.setToken(newToken())
	s.mu.Unlock()
	return s.persist(ctx, sb)
}

// Restore reads the front door's records back after a start (see State
// above). Call it once, before serving.
func (s *Server) Restore(ctx context.Context) error {
	var sbs []sandboxRecord
	snaps := map[string]snapshotRecordJSON{}
	var errs []error
	err := s.f.FrontRecords(ctx, frontDoor, func(id string, v []byte) error {
		switch {
		case strings.HasPrefix(id, "sbx-"):
			var r sandboxRecord
			if err := json.Unmarshal(v, &r); err != nil || r.SandboxID != id[len("sbx-"):] {
				errs = append(errs, fmt.Errorf("e2b record %s does not decode: %v", id, err))
				return nil
			}
			sbs = append(sbs, r)
		case strings.HasPrefix(id, "snap-"):
			var r snapshotRecordJSON
			if err := json.Unmarshal(v, &r); err != nil {
				errs = append(errs, fmt.Errorf("e2b record %s does not decode: %v", id, err))
				return nil
			}
			snaps[id[len("snap-"):]] = r
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("e2b: read the front door's records: %w", err)
	}
	var running, paused, dropped int
	for _, r := range sbs {
		sb, err := s.restoreSandbox(ctx, r)
		if errors.Is(err, errOtherWorker) {
			continue // its record stays for that worker's front door
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		switch {
		case sb == nil:
			dropped++
			s.forgetRecord(ctx, r.SandboxID)
		case sb.paused != "":
			paused++
		default:
			running++
		}
	}
	for node, r := range snaps {
		in, err := s.f.Inspect(ctx, node)
		if err != nil && errdefs.CodeOf(err) != errdefs.CodeNotFound {
			errs = append(errs, err)
			continue
		}
		if err != nil || in.Node == nil || in.Node.Status == journal.NodePruned {
			s.f.DeleteFrontRecord(ctx, frontDoor, "snap-"+node)
			continue
		}
		s.mu.Lock()
		s.snapshots[node] = snapshotRecord{sandboxID: r.SandboxID, names: r.Names}
		s.mu.Unlock()
	}
	s.log.Info("e2b: state restored", "running", running, "paused", paused, "dropped", dropped, "snapshots", len(s.snapshots))
	return errors.Join(errs...)
}

// errOtherWorker: a running sandbox's attempt runs on another worker of
// the graph.
var errOtherWorker = errors.New("the attempt runs on another worker")

// restoreSandbox registers the sandbox r records, or returns nil if it
// is gone (its attempt ended, its paused node was pruned).
func (s *Server) restoreSandbox(ctx context.Context, r sandboxRecord) (*sandbox, error) {
	sb := &sandbox{id: r.SandboxID, templateID: r.TemplateID, metadata: r.Metadata, env: r.Env, autoPause: r.AutoPause,
		startedAt: r.StartedAt, endAt: r.EndAt, cpus: max(s.opts.CPUCount, 1), memoryMB: s.opts.MemoryMB}
	if sb.metadata == nil {
		sb.metadata = map[string]string{}
	}
	for _, t := range r.TokenSHA256 {
		var h [32]byte
		if b, err := hex.DecodeString(t); err == nil && len(b) == len(h) {
			copy(h[:], b)
			sb.tokens = append(sb.tokens, h)
		}
	}
	id := r.PausedNodeID
	if id == "" {
		id = r.AttemptID
	}
	in, err := s.f.Inspect(ctx, id)
	if err != nil {
		if errdefs.CodeOf(err) == errdefs.CodeNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("e2b: restore sandbox %s: %w", r.SandboxID, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.PausedNodeID != "" {
		if in.Node == nil || in.Node.Status == journal.NodePruned {
			return nil, nil
		}
		sb.paused = r.PausedNodeID
	} else {
		a := in.Attempt
		if a != nil && a.Runtime != nil && a.Runtime.Worker != s.f.WorkerID() {
			return nil, errOtherWorker
		}
		if a == nil || !a.State.Live() || a.Lease == nil || a.Root == "" {
			// Ended while esfd was down (its lease expired, its delta was
			// lost).
			return nil, nil
		}
		sb.attempt = *a
		sb.procs = newProcTable(s.ctx)
		s.arm(sb) // a timeout that passed meanwhile ends it now
	}
	s.sandboxes[sb.id] = sb
	return sb, nil
}
