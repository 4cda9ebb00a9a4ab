package esf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// Options configures a Provider. Client (or Socket) is required; the rest
// has defaults.
type Options struct {
	// Client talks to esfd. When nil, the provider makes one for Socket
	// and closes it in Close.
	Client *client.Client
	Socket string
	// Image is what a Spec without one starts from: a node id, a root id
	// or a local path (directory, tar, OCI layout) imported on each Create.
	Image string
	// Home is the sessions' home directory ("~"), created if missing;
	// default "/root".
	Home string
	// Namespace keeps this provider's sessions apart from those of other
	// providers on the same daemon: Attach, Sessions and the ids only see
	// their own. Default "default".
	Namespace string
	// MemoryBytes, Pids and CPUs limit each session's container; zero is
	// the daemon's default.
	MemoryBytes int64
	Pids        int64
	CPUs        float64
	// User is the containers' user, "UID[:GID]"; empty is root.
	User string
	// LeaseTTL is how long a running session survives without a call
	// before the daemon reclaims it (Spec.Timeout overrides it per
	// session); every call renews it once a third of it has passed, and a
	// running command keeps it renewed. Default 10 minutes.
	LeaseTTL time.Duration
	// CleanupTimeout bounds the cleanup that follows a failed or cancelled
	// Create or Resume (it runs on a fresh context). Default one minute.
	CleanupTimeout time.Duration
}

// Validate reports the first problem of o.
func (o *Options) Validate() error {
	if o.Client == nil && o.Socket == "" {
		return invalid("options", "neither a client nor a socket")
	}
	if o.Home != "" && !strings.HasPrefix(o.Home, "/") {
		return invalid("options", "home %q is not absolute", o.Home)
	}
	if o.LeaseTTL < 0 || o.CleanupTimeout < 0 || o.MemoryBytes < 0 || o.Pids < 0 || o.CPUs < 0 {
		return invalid("options", "negative duration or limit")
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Home == "" {
		o.Home = "/root"
	}
	o.Home = filepath.Clean(o.Home)
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = v1.DefaultLeaseTTL
	}
	if o.CleanupTimeout == 0 {
		o.CleanupTimeout = time.Minute
	}
	return o
}

// Provider is esf as a workspace.Provider. It is safe for concurrent use.
type Provider struct {
	c       *client.Client
	ownsC   bool
	opts    Options
	cleanup time.Duration

	// The groups seen in the event log so far: true while they may be a
	// session of ours, false once known not to be (another namespace,
	// closed, reclaimed: all final).
	mu     sync.Mutex
	seen   uint64
	groups map[string]bool
}

var (
	_ workspace.Provider   = (*Provider)(nil)
	_ workspace.Enumerator = (*Provider)(nil)
)

// New returns a provider of sessions on the esfd opts names.
func New(opts Options) (*Provider, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	p := &Provider{c: opts.Client, opts: opts, cleanup: opts.CleanupTimeout, groups: map[string]bool{}}
	if p.c == nil {
		p.c, p.ownsC = client.NewClient(opts.Socket), true
	}
	return p, nil
}

// Close releases the client the provider made. Sessions stay.
func (p *Provider) Close() {
	if p.ownsC {
		p.c.Close()
	}
}

// The provider's marks in the journal: the group's policy holds the
// session's record, and nodes carry a logical state naming their role.
const (
	policyKey = "esf.workspace"
	markRun   = "run"    // a node a session runs on (a draft) or paused at (sealed)
	markClose = "closed" // the tombstone of a closed session
)

// record is what a session keeps in its group's policy: all Attach needs
// to rebuild a handle.
type record struct {
	Namespace string            `json:"ns"`
	Home      string            `json:"home"`
	WorkDir   string            `json:"workdir"`
	Env       map[string]string `json:"env,omitempty"`
	TTLMillis int64             `json:"ttl_ms"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Image     string            `json:"image,omitempty"`
}

func (r record) policy() json.RawMessage {
	b, _ := json.Marshal(map[string]record{policyKey: r})
	return b
}

func parsePolicy(b json.RawMessage) (record, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil || m[policyKey] == nil {
		return record{}, false
	}
	var r record
	if json.Unmarshal(m[policyKey], &r) != nil || !strings.HasPrefix(r.Home, "/") || !strings.HasPrefix(r.WorkDir, "/") {
		return record{}, false
	}
	return r, true
}

func mark(role string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{policyKey: role})
	return b
}

func markOf(b json.RawMessage) string {
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return ""
	}
	s, _ := m[policyKey].(string)
	return s
}

func (r record) envList() []string {
	keys := slices.Sorted(maps.Keys(r.Env))
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+r.Env[k])
	}
	return out
}

func checkEnv(op string, env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return invalid(op, "env key %q: want a non-empty key without '=' or NUL", k)
		}
	}
	return nil
}

// Create makes a session: a group on the image's root (imported first when
// Image is a local path), a draft node to run on, and a runc attempt on it
// with the home and working directories in place. The session's ID is the
// group's id. If anything fails, or ctx ends, whatever was made is
// released and the group closed, on a fresh context bounded by
// Options.CleanupTimeout: no attempt, container or lease is left.
func (p *Provider) Create(ctx context.Context, spec workspace.Spec) (workspace.Session, error) {
	image := spec.Image
	if image == "" {
		image = p.opts.Image
	}
	if image == "" {
		return nil, invalid("create", "no image in the spec and no default image")
	}
	rec := record{Namespace: p.opts.Namespace, Home: p.opts.Home, WorkDir: p.opts.Home, Env: spec.Env,
		TTLMillis: p.opts.LeaseTTL.Milliseconds(), Metadata: spec.Metadata, Image: image}
	if spec.WorkDir != "" {
		wd, err := vfs.Resolve(rec.Home, rec.Home, spec.WorkDir)
		if err != nil {
			return nil, err
		}
		rec.WorkDir = wd
	}
	if spec.Timeout > 0 {
		rec.TTLMillis = max(spec.Timeout.Milliseconds(), 1)
	}
	if err := checkEnv("create", spec.Env); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	root, err := p.resolveImage(ctx, image)
	if err != nil {
		return nil, err
	}

	u := undo{rec: rec}
	s, err := p.create(ctx, &u, root)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cleanup)
		defer cancel()
		if cerr := p.undo(cctx, &u, true); cerr != nil {
			err = withCleanup(err, cerr)
		}
		return nil, err
	}
	return s, nil
}

// resolveImage turns an image into something CreateGroup takes: node and
// root ids as they are, a local path imported.
func (p *Provider) resolveImage(ctx context.Context, image string) (string, error) {
	if strings.HasPrefix(image, string(v1.KindNode)+"_") {
		return image, nil
	}
	if _, err := v1.ParseID(image); err == nil {
		return image, nil
	}
	abs, err := filepath.Abs(image)
	if err != nil {
		return "", invalid("create", "image %q: %v", image, err)
	}
	res, err := p.c.Import(ctx, abs, client.CallOptions{})
	if err != nil {
		return "", mapErr(ctx, "import", err, false)
	}
	return res.RootID.String(), nil
}

// undo remembers the mutations of a Create or Resume under way, each with
// its idempotency key, so cleanup can find what they made even when a
// reply was lost.
type undo struct {
	rec record // the session's

	groupKey string
	groupReq *v1.CreateGroupRequest
	group    *v1.CreateGroupResult

	forkKey string
	forkReq *v1.ForkRequest
	node    string // the draft to run on, once known
	ownNode bool   // made by this call: prune it when the call fails

	actKey  string
	actReq  *v1.ActivateRequest // nil when refused: nothing to replay
	actSent bool                // an attempt may have run on node
	att     *v1.AttemptView
}

func (p *Provider) create(ctx context.Context, u *undo, root string) (*Session, error) {
	rec := u.rec
	u.groupKey = newKey("group")
	u.groupReq = &v1.CreateGroupRequest{RootID: root, Source: rec.Image, Policy: rec.policy()}
	g, err := p.c.CreateGroup(ctx, *u.groupReq, keyed(u.groupKey))
	if err != nil {
		if !outcomeUnknown(ctx, err) {
			u.groupReq = nil // refused: nothing to undo
		}
		return nil, mapErr(ctx, "create group", err, false)
	}
	u.group = g
	if err := p.startOn(ctx, u, g.Node); err != nil {
		return nil, err
	}
	r, err := openRoot(u.att.Root)
	if err != nil {
		return nil, &workspace.ProviderError{Provider: ProviderName, Op: "create", Message: err.Error()}
	}
	defer r.Close()
	for _, d := range []string{rec.Home, rec.WorkDir} {
		fd, err := r.MkdirAll(d, 0o755)
		if err != nil {
			return nil, fsError("mkdir", d, err)
		}
		closeFD(fd)
	}
	s := newSession(p, g.Group.GroupID, rec)
	s.adopt(*u.att)
	return s, nil
}

// startOn forks a draft off the sealed node n (unless n is an untouched
// draft already) and activates it.
func (p *Provider) startOn(ctx context.Context, u *undo, n v1.Node) error {
	u.node = n.NodeID
	if n.Status != v1.NodeDraft {
		u.forkKey = newKey("fork")
		u.forkReq = &v1.ForkRequest{NodeID: n.NodeID, N: 1, LogicalState: mark(markRun)}
		fr, err := p.c.Fork(ctx, *u.forkReq, keyed(u.forkKey))
		if err != nil {
			u.node = ""
			if !outcomeUnknown(ctx, err) {
				u.forkReq = nil
			}
			return mapErr(ctx, "fork", err, false)
		}
		u.node, u.ownNode = fr.Nodes[0].NodeID, true
	}
	u.actKey, u.actSent = newKey("activate"), true
	rec := u.rec
	u.actReq = &v1.ActivateRequest{NodeID: u.node, Executor: v1.ExecutorRunc, TTLMillis: rec.TTLMillis,
		NoQueue: true, MemoryBytes: p.opts.MemoryBytes, Pids: p.opts.Pids, CPUs: p.opts.CPUs,
		Env: rec.envList(), User: p.opts.User}
	av, err := p.c.Activate(ctx, *u.actReq, keyed(u.actKey))
	if err != nil {
		if !outcomeUnknown(ctx, err) {
			u.actReq = nil
		}
		return mapErr(ctx, "activate", err, false)
	}
	u.att = av
	switch {
	case av.State != v1.AttemptActive:
		return &workspace.ProviderError{Provider: ProviderName, Op: "activate", Code: string(errdefs.CodeFailedPrecondition),
			Message: fmt.Sprintf("attempt %s is %s: %s", av.AttemptID, av.State, av.Error)}
	case av.Root == "":
		return &workspace.ProviderError{Provider: ProviderName, Op: "activate", Code: string(errdefs.CodeFailedPrecondition),
			Message: fmt.Sprintf("attempt %s is not mounted on this host: its files are out of reach", av.AttemptID)}
	}
	return ctx.Err()
}

// undo reverts a failed Create (closeGroup: the group is closed too) or
// Resume (the session stays paused at its last seal). Calls whose outcome
// is unknown are replayed under their keys first: a replay returns what
// the first call made, or makes it now, and either way cleanup then knows
// its ids.
func (p *Provider) undo(ctx context.Context, u *undo, closeGroup bool) error {
	var errs []error
	if u.group == nil && u.groupReq != nil {
		g, err := p.c.CreateGroup(ctx, *u.groupReq, keyed(u.groupKey))
		if err != nil {
			return mapErr(ctx, "create group", err, false) // the group is unknown: nothing else can exist
		}
		u.group = g
	}
	if u.node == "" && u.forkReq != nil {
		if fr, err := p.c.Fork(ctx, *u.forkReq, keyed(u.forkKey)); err == nil {
			u.node, u.ownNode = fr.Nodes[0].NodeID, true
		} else {
			errs = append(errs, mapErr(ctx, "fork", err, false))
		}
	}
	if u.att == nil && u.actReq != nil {
		// The replay's own failure does not matter: the sweep below finds
		// whatever either call left.
		if av, err := p.c.Activate(ctx, *u.actReq, keyed(u.actKey)); err == nil {
			u.att = av
		}
	}
	if u.att != nil && u.att.State.Live() {
		if _, err := p.c.Release(ctx, v1.ReleaseRequest{AttemptID: u.att.AttemptID}, client.CallOptions{}); err != nil {
			errs = append(errs, mapErr(ctx, "release", err, false))
		}
	}
	if u.node != "" && u.actSent {
		// Every attempt on the draft is this call's: none may stay live.
		if err := p.releaseAll(ctx, u.node); err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case closeGroup && u.group != nil:
		if err := p.closeGroup(ctx, u.group.Group.GroupID, u.group.Group.RootNodeID); err != nil {
			errs = append(errs, err)
		}
	case u.node != "" && (u.ownNode || u.actSent):
		// The draft is dead weight now (an attempt that ran on it ended
		// unsealed): pruned, the session's newest node is its last seal
		// again, and the session reads as paused.
		if _, err := p.c.Prune(ctx, v1.PruneRequest{NodeID: u.node}, client.CallOptions{}); err != nil {
			errs = append(errs, mapErr(ctx, "prune", err, false))
		}
	}
	return errors.Join(errs...)
}

// releaseAll releases every live attempt on node.
func (p *Provider) releaseAll(ctx context.Context, node string) error {
	in, err := p.c.Inspect(ctx, node, client.CallOptions{})
	if err != nil {
		return mapErr(ctx, "inspect", err, false)
	}
	var errs []error
	for _, id := range in.Node.Attempts {
		a, err := p.c.Inspect(ctx, id, client.CallOptions{})
		if err != nil {
			errs = append(errs, mapErr(ctx, "inspect", err, false))
			continue
		}
		if a.Attempt.State.Live() {
			if _, err := p.c.Release(ctx, v1.ReleaseRequest{AttemptID: id}, client.CallOptions{}); err != nil {
				errs = append(errs, mapErr(ctx, "release", err, false))
			}
		}
	}
	return errors.Join(errs...)
}

// withCleanup adds what a failed cleanup said to err's message without
// joining it into err's chain: the caller's errors.Is must see err's class
// alone (a cut Create is DeadlineExceeded, not also ErrProvider).
func withCleanup(err, cleanup error) error {
	return fmt.Errorf("%w (cleanup: %v)", err, cleanup)
}

// closeGroup closes a session for good: a tombstone node marks it closed
// (groups cannot be deleted), then every node below the group's root is
// pruned so the daemon's GC may reclaim the session's seals. Nothing may
// hold a lease in it.
func (p *Provider) closeGroup(ctx context.Context, groupID, rootNode string) error {
	req := v1.ForkRequest{NodeID: rootNode, N: 1, LogicalState: mark(markClose)}
	if _, err := p.c.Fork(ctx, req, keyed(newKey("close"))); err != nil {
		return mapErr(ctx, "close", err, false)
	}
	p.forget(groupID)
	in, err := p.c.Inspect(ctx, rootNode, client.CallOptions{})
	if err != nil {
		return mapErr(ctx, "close", err, false)
	}
	var errs []error
	for _, child := range in.Node.Children {
		if _, err := p.c.Prune(ctx, v1.PruneRequest{NodeID: child}, client.CallOptions{}); err != nil {
			errs = append(errs, mapErr(ctx, "prune", err, false))
		}
	}
	return errors.Join(errs...)
}

// Attach returns a handle to the running or paused session id without
// changing it. An id that is not a session of this provider's namespace,
// a closed session and one the daemon reclaimed (its lease expired) are
// workspace.ErrNotFound.
func (p *Provider) Attach(ctx context.Context, id string) (workspace.Session, error) {
	f, err := p.lookup(ctx, "attach", id)
	if err != nil {
		return nil, err
	}
	s := newSession(p, id, f.rec)
	if f.att != nil {
		s.adopt(*f.att)
	}
	return s, nil
}

// found is a session as the journal shows it.
type found struct {
	rec   record
	group v1.Group
	// node is the newest node the session runs on (a draft) or paused at
	// (sealed, or a draft no attempt touched yet).
	node v1.Node
	// att is the live attempt on node; nil when paused.
	att *v1.AttemptView
	// drafts are the unpruned drafts the session ran on: node, and older
	// ones only when two handles resumed at once.
	drafts []string
}

// errNoSession is why lookup found no session.
type errNoSession struct {
	id, why string
	// final: it will never be a session (again); a group whose Create is
	// under way is not final.
	final bool
	// group is set when the session existed and ended without Close: the
	// daemon reclaimed it.
	reclaimed *v1.Group
}

func (e *errNoSession) Error() string {
	return fmt.Sprintf("%s session %s: %s", ProviderName, e.id, e.why)
}
func (e *errNoSession) Is(target error) bool {
	return target == workspace.ErrNotFound
}

// lookup reads a session's state from its group:
//
//   - the policy must hold a record of this namespace;
//   - a tombstone node means closed;
//   - the newest unpruned run node decides: sealed is paused; a draft
//     with a live attempt is running, with no attempt at all paused (a
//     Resume cut before it activated), with only ended attempts gone (the
//     lease expired or the attempt failed: the unsealed work is lost).
func (p *Provider) lookup(ctx context.Context, op, id string) (found, error) {
	if !strings.HasPrefix(id, string(v1.KindGroup)+"_") {
		return found{}, &errNoSession{id: id, why: "not an esf session id", final: true}
	}
	tr, err := p.c.Tree(ctx, id, client.CallOptions{})
	if err != nil {
		if codeIs(err, errdefs.CodeNotFound, errdefs.CodeInvalidArgument) {
			return found{}, &errNoSession{id: id, why: "no such group", final: true}
		}
		return found{}, mapErr(ctx, op, err, true)
	}
	rec, ok := parsePolicy(tr.Group.Policy)
	if !ok || rec.Namespace != p.opts.Namespace {
		return found{}, &errNoSession{id: id, why: "not a session of this provider", final: true}
	}
	f := found{rec: rec, group: tr.Group}
	var latest *v1.Node
	for i := range tr.Nodes {
		n := &tr.Nodes[i]
		switch markOf(n.LogicalState) {
		case markClose:
			return found{}, &errNoSession{id: id, why: "closed", final: true}
		case markRun:
			if n.Status != v1.NodePruned {
				latest = n
			}
			if n.Status == v1.NodeDraft {
				f.drafts = append(f.drafts, n.NodeID)
			}
		}
	}
	if latest == nil {
		// A Create under way, or one whose process died before its
		// cleanup: that one never becomes a session.
		final := time.Since(tr.Group.CreatedAt) > 2*p.cleanup
		return found{}, &errNoSession{id: id, why: "not started", final: final}
	}
	f.node = *latest
	switch latest.Status {
	case v1.NodeSealed:
		return f, nil
	case v1.NodeDraft:
	default:
		return found{}, &errNoSession{id: id, why: "node " + latest.NodeID + " is " + string(latest.Status), final: true}
	}
	in, err := p.c.Inspect(ctx, latest.NodeID, client.CallOptions{})
	if err != nil {
		return found{}, mapErr(ctx, op, err, true)
	}
	atts := in.Node.Attempts
	for i := len(atts) - 1; i >= 0; i-- {
		a, err := p.c.Inspect(ctx, atts[i], client.CallOptions{})
		if err != nil {
			return found{}, mapErr(ctx, op, err, true)
		}
		if a.Attempt != nil && a.Attempt.State.Live() {
			f.att = a.Attempt
			return f, nil
		}
	}
	if len(atts) == 0 {
		return f, nil
	}
	return found{}, &errNoSession{id: id, why: "reclaimed (its attempt ended without a seal)", final: true, reclaimed: &tr.Group}
}

// Sessions lists the running and paused sessions of this provider's
// namespace, sorted by id. It reads the daemon's event log for groups
// (incrementally: only events after the last call) and each candidate's
// state; groups known not to be live sessions are not read again.
func (p *Provider) Sessions(ctx context.Context) ([]workspace.Info, error) {
	p.mu.Lock()
	err := p.c.Events(ctx, v1.EventsQuery{After: p.seen, Types: []string{v1.EventGroupCreated}}, func(ev v1.Event) error {
		p.seen = ev.Seq
		if _, ok := p.groups[ev.GroupID]; !ok && ev.GroupID != "" {
			p.groups[ev.GroupID] = true
		}
		return nil
	})
	var ids []string
	for id, live := range p.groups {
		if live {
			ids = append(ids, id)
		}
	}
	p.mu.Unlock()
	if err != nil {
		return nil, mapErr(ctx, "sessions", err, false)
	}
	slices.Sort(ids)
	out := []workspace.Info{}
	for _, id := range ids {
		f, err := p.lookup(ctx, "sessions", id)
		var no *errNoSession
		if errors.As(err, &no) {
			if no.final {
				p.forget(id)
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, workspace.Info{ID: id, Paused: f.att == nil, Metadata: maps.Clone(f.rec.Metadata)})
	}
	return out, nil
}

// forget marks a group as never again a live session.
func (p *Provider) forget(id string) {
	p.mu.Lock()
	p.groups[id] = false
	p.mu.Unlock()
}
