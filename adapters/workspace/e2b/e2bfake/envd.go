package e2bfake

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
)

// EnvdOptions configures one sandbox's envd.
type EnvdOptions struct {
	// Root is the host directory that stands for the sandbox's "/".
	Root string
	// User is the default user; Home its home directory (a sandbox path).
	// Requests may name User or "root"; any other user is refused.
	User, Home string
	// AccessToken, when set, must arrive as X-Access-Token.
	AccessToken string
	// Env is the sandbox-wide environment (the create call's envVars).
	Env map[string]string
	// Keepalive is the keepalive interval when the client asks for none;
	// zero means envd's 90 s.
	Keepalive time.Duration
	// NoJail runs commands on the host with only their cwd mapped, even
	// where a jail is possible.
	NoJail bool
}

// Envd is one sandbox's envd: the Connect process and filesystem services
// and the /files API, over a host directory. Sandbox path p is the host
// path Root+p for the file RPCs and /files.
//
// Commands run in a jail when the process is root on Linux: a private
// mount namespace with the host's /usr, /etc (read-only), /dev and /proc
// bound into Root, entered with nsenter and chrooted to Root, so a command
// sees exactly the files the RPCs see and pwd prints sandbox paths. Otherwise (or with NoJail)
// they run on the host with only their cwd mapped into Root and HOME set
// to the mapped home; a command naming an absolute path then reaches the
// host's path of that name. Either way this is a fake of the protocol,
// not a security boundary.
type Envd struct {
	opts    EnvdOptions
	handler http.Handler
	jail    *jail // nil: commands run on the host with the cwd mapped

	mu    sync.Mutex
	procs map[uint32]*proc
	wg    sync.WaitGroup
}

// NewEnvd serves opts.Root, creating the home directory.
func NewEnvd(opts EnvdOptions) (*Envd, error) {
	if opts.User == "" {
		opts.User = "user"
	}
	if opts.Home == "" {
		opts.Home = "/home/" + opts.User
	}
	if opts.Keepalive == 0 {
		opts.Keepalive = 90 * time.Second
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, err
	}
	opts.Root = root
	if err := os.MkdirAll(filepath.Join(root, filepath.FromSlash(opts.Home)), 0o755); err != nil {
		return nil, err
	}
	e := &Envd{opts: opts, procs: map[uint32]*proc{}}
	if !opts.NoJail && jailAvailable() {
		j, err := startJail(root)
		if err != nil {
			return nil, err
		}
		e.jail = j
	}
	codec := connect.WithCodec(envd.Codec{})
	mux := http.NewServeMux()
	mux.Handle(envd.ProcStart, connect.NewServerStreamHandler(envd.ProcStart, e.start, codec))
	mux.Handle(envd.ProcSendInput, connect.NewUnaryHandler(envd.ProcSendInput, e.sendInput, codec))
	mux.Handle(envd.ProcCloseStdin, connect.NewUnaryHandler(envd.ProcCloseStdin, e.closeStdin, codec))
	mux.Handle(envd.ProcSendSignal, connect.NewUnaryHandler(envd.ProcSendSignal, e.sendSignal, codec))
	mux.Handle(envd.FsStat, connect.NewUnaryHandler(envd.FsStat, e.stat, codec))
	mux.Handle(envd.FsListDir, connect.NewUnaryHandler(envd.FsListDir, e.listDir, codec))
	mux.Handle(envd.FsMakeDir, connect.NewUnaryHandler(envd.FsMakeDir, e.makeDir, codec))
	mux.Handle(envd.FsRemove, connect.NewUnaryHandler(envd.FsRemove, e.remove, codec))
	mux.Handle(envd.FsMove, connect.NewUnaryHandler(envd.FsMove, e.move, codec))
	mux.HandleFunc("GET /files", e.download)
	mux.HandleFunc("POST /files", e.upload)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	e.handler = mux
	return e, nil
}

// ServeHTTP applies envd's access-token rule, then serves the request.
func (e *Envd) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if e.opts.AccessToken != "" && r.Header.Get(envd.HeaderAccessToken) != e.opts.AccessToken {
		switch {
		case r.URL.Path == "/health":
		case r.URL.Path == "/files":
			// Passes the middleware; the handler wants a token or a
			// signature, and this fake implements no signatures.
			WriteError(w, http.StatusUnauthorized, "missing signature query parameter")
			return
		default:
			WriteError(w, http.StatusUnauthorized, "unauthorized access, please provide a valid access token or method signing if supported")
			return
		}
	}
	e.handler.ServeHTTP(w, r)
}

// Jailed reports whether commands run chrooted into the sandbox root.
func (e *Envd) Jailed() bool { return e.jail != nil }

// Processes counts the processes still running.
func (e *Envd) Processes() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.procs)
}

// Close kills every process and dismantles the jail. The files stay.
func (e *Envd) Close() {
	e.KillAll()
	if e.jail != nil {
		e.jail.close()
	}
}

// KillAll kills every process and waits for them to be reaped.
func (e *Envd) KillAll() {
	e.mu.Lock()
	for _, p := range e.procs {
		p.signal(syscall.SIGKILL)
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// WriteError writes the JSON error body envd and the control plane use.
func WriteError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(envd.HTTPErrorBody{Code: status, Message: msg})
}

// user checks the Basic-auth user of an RPC.
func (e *Envd) user(h http.Header) error {
	a := h.Get("Authorization")
	if a == "" {
		return nil
	}
	raw, ok := strings.CutPrefix(a, "Basic ")
	if !ok {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("invalid authorization header"))
	}
	b, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("invalid authorization header"))
	}
	return e.checkUser(strings.TrimSuffix(string(b), ":"))
}

func (e *Envd) checkUser(u string) error {
	if u != "" && u != e.opts.User && u != "root" {
		return connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("invalid username: '%s'", u))
	}
	return nil
}

// resolve maps a request path to (sandbox path, host path). Relative paths
// are relative to the home directory, as in envd.
func (e *Envd) resolve(p string) (string, string, error) {
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return "", "", fmt.Errorf("invalid path %q", p)
	}
	if p == "~" {
		p = e.opts.Home
	} else if rest, ok := strings.CutPrefix(p, "~/"); ok {
		p = path.Join(e.opts.Home, rest)
	} else if !strings.HasPrefix(p, "/") {
		p = path.Join(e.opts.Home, p)
	}
	p = path.Clean(p)
	return p, filepath.Join(e.opts.Root, filepath.FromSlash(p)), nil
}

func (e *Envd) entry(sp, hp string) (*envd.EntryInfo, error) {
	fi, err := os.Lstat(hp)
	if err != nil {
		return nil, err
	}
	return e.entryOf(sp, hp, fi), nil
}

func (e *Envd) entryOf(sp, hp string, fi fs.FileInfo) *envd.EntryInfo {
	mt := fi.ModTime().UTC()
	en := &envd.EntryInfo{
		Name:         path.Base(sp),
		Path:         sp,
		Size:         envd.Int64(fi.Size()),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		Owner:        e.opts.User,
		Group:        e.opts.User,
		ModifiedTime: &mt,
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		en.Type = envd.FileTypeSymlink
		if t, err := os.Readlink(hp); err == nil {
			en.SymlinkTarget = &t
		}
	case fi.IsDir():
		en.Type = envd.FileTypeDir
	case fi.Mode().IsRegular():
		en.Type = envd.FileTypeFile
	}
	return en
}

func fsError(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, errors.New(msg))
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, errors.New(msg))
	}
	return connect.NewError(connect.CodeInternal, fmt.Errorf("%s: %v", msg, err))
}

func (e *Envd) stat(_ context.Context, req *connect.Request[envd.PathRequest]) (*connect.Response[envd.EntryResponse], error) {
	if err := e.user(req.Header()); err != nil {
		return nil, err
	}
	sp, hp, err := e.resolve(req.Msg.Path)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	en, err := e.entry(sp, hp)
	if err != nil {
		return nil, fsError(err, "file not found: %s", sp)
	}
	return connect.NewResponse(&envd.EntryResponse{Entry: en}), nil
}

func (e *Envd) listDir(_ context.Context, req *connect.Request[envd.ListDirRequest]) (*connect.Response[envd.ListDirResponse], error) {
	if err := e.user(req.Header()); err != nil {
		return nil, err
	}
	sp, hp, err := e.resolve(req.Msg.Path)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	fi, err := os.Stat(hp) // the listed directory itself may be a symlink
	if err != nil {
		return nil, fsError(err, "path not found: %s", sp)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path is not a directory: %s", sp))
	}
	depth := int(req.Msg.Depth)
	if depth == 0 {
		depth = 1
	}
	var out []*envd.EntryInfo
	var walk func(sp, hp string, level int) error
	walk = func(sp, hp string, level int) error {
		des, err := os.ReadDir(hp)
		if err != nil {
			return err
		}
		for _, de := range des {
			csp, chp := path.Join(sp, de.Name()), filepath.Join(hp, de.Name())
			info, err := de.Info()
			if err != nil {
				continue // removed meanwhile
			}
			out = append(out, e.entryOf(csp, chp, info))
			if de.IsDir() && level < depth {
				if err := walk(csp, chp, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(sp, hp, 1); err != nil {
		return nil, fsError(err, "list %s", sp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return connect.NewResponse(&envd.ListDirResponse{Entries: out}), nil
}

func (e *Envd) makeDir(_ context.Context, req *connect.Request[envd.PathRequest]) (*connect.Response[envd.EntryResponse], error) {
	if err := e.user(req.Header()); err != nil {
		return nil, err
	}
	sp, hp, err := e.resolve(req.Msg.Path)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if fi, err := os.Stat(hp); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory already exists: %s", sp))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path already exists but it is not a directory: %s", sp))
	}
	if err := os.MkdirAll(hp, 0o755); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("error creating directory: %v", err))
	}
	en, err := e.entry(sp, hp)
	if err != nil {
		return nil, fsError(err, "stat %s", sp)
	}
	return connect.NewResponse(&envd.EntryResponse{Entry: en}), nil
}

func (e *Envd) remove(_ context.Context, req *connect.Request[envd.PathRequest]) (*connect.Response[envd.Empty], error) {
	if err := e.user(req.Header()); err != nil {
		return nil, err
	}
	sp, hp, err := e.resolve(req.Msg.Path)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if sp == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("cannot remove /"))
	}
	if err := os.RemoveAll(hp); err != nil {
		return nil, fsError(err, "error removing file or directory: %s", sp)
	}
	return connect.NewResponse(&envd.Empty{}), nil
}

func (e *Envd) move(_ context.Context, req *connect.Request[envd.MoveRequest]) (*connect.Response[envd.EntryResponse], error) {
	if err := e.user(req.Header()); err != nil {
		return nil, err
	}
	ssp, shp, err := e.resolve(req.Msg.Source)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	dsp, dhp, err := e.resolve(req.Msg.Destination)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if _, err := os.Lstat(shp); err != nil {
		return nil, fsError(err, "source file not found: %s", ssp)
	}
	if err := os.MkdirAll(filepath.Dir(dhp), 0o755); err != nil {
		return nil, fsError(err, "error creating destination parent: %s", dsp)
	}
	if err := os.Rename(shp, dhp); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("error renaming: %v", err))
	}
	en, err := e.entry(dsp, dhp)
	if err != nil {
		return nil, fsError(err, "stat %s", dsp)
	}
	return connect.NewResponse(&envd.EntryResponse{Entry: en}), nil
}

// download serves GET /files: the raw bytes, or envd's JSON errors.
func (e *Envd) download(w http.ResponseWriter, r *http.Request) {
	if err := e.checkUser(r.URL.Query().Get("username")); err != nil {
		WriteError(w, http.StatusUnauthorized, "invalid user")
		return
	}
	sp, hp, err := e.resolve(r.URL.Query().Get("path"))
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	f, err := os.Open(hp)
	if errors.Is(err, fs.ErrNotExist) {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", sp))
		return
	}
	if err != nil {
		WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if fi.IsDir() {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", sp))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", fmt.Sprint(fi.Size()))
	_, _ = io.Copy(w, f)
}

// upload serves POST /files, multipart ("file" parts) or a raw
// octet-stream body, streaming each file to disk in place.
func (e *Envd) upload(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if err := e.checkUser(q.Get("username")); err != nil {
		WriteError(w, http.StatusUnauthorized, "invalid user")
		return
	}
	var out []envd.UploadedEntry
	ct := r.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "multipart/form-data"):
		mr, err := r.MultipartReader()
		if err != nil {
			WriteError(w, http.StatusBadRequest, err.Error())
			return
		}
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				WriteError(w, http.StatusBadRequest, "error reading multipart: "+err.Error())
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			p := q.Get("path")
			if p == "" {
				p = part.FileName()
			}
			en, status, err := e.writeFile(p, part)
			part.Close()
			if err != nil {
				WriteError(w, status, err.Error())
				return
			}
			out = append(out, en)
		}
	case strings.HasPrefix(ct, "application/octet-stream"):
		p := q.Get("path")
		if p == "" {
			WriteError(w, http.StatusBadRequest, "path query parameter is required for raw body upload")
			return
		}
		en, status, err := e.writeFile(p, r.Body)
		if err != nil {
			WriteError(w, status, err.Error())
			return
		}
		out = append(out, en)
	default:
		WriteError(w, http.StatusBadRequest, "unsupported content type: "+ct)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (e *Envd) writeFile(p string, r io.Reader) (envd.UploadedEntry, int, error) {
	sp, hp, err := e.resolve(p)
	if err != nil {
		return envd.UploadedEntry{}, http.StatusBadRequest, err
	}
	if fi, err := os.Stat(hp); err == nil && fi.IsDir() {
		return envd.UploadedEntry{}, http.StatusBadRequest, fmt.Errorf("path '%s' is a directory", sp)
	}
	if err := os.MkdirAll(filepath.Dir(hp), 0o755); err != nil {
		return envd.UploadedEntry{}, http.StatusBadRequest, fmt.Errorf("error ensuring directories: %v", err)
	}
	f, err := os.OpenFile(hp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return envd.UploadedEntry{}, http.StatusInternalServerError, fmt.Errorf("error opening file: %v", err)
	}
	_, werr := io.Copy(f, r)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return envd.UploadedEntry{}, http.StatusInsufficientStorage, errors.New("not enough disk space available")
		}
		return envd.UploadedEntry{}, http.StatusInternalServerError, fmt.Errorf("error writing file: %v", err)
	}
	return envd.UploadedEntry{Path: sp, Name: path.Base(sp), Type: "file"}, 0, nil
}
