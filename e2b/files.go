package e2b

import (
	"compress/gzip"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/e2b/envdwire"
	"github.com/esf-dev/esf/internal/rootfs"
)

// envd's filesystem service and /files, on the attempt's root as the host
// mounts it: every path is resolved inside that root (internal/rootfs:
// openat2 with RESOLVE_IN_ROOT, so no symlink or ".." leaves it), and
// every call acts as the sandbox's root (asSandboxRoot). Relative paths
// are relative to the user's home, as in envd.

// sandboxPath makes p absolute and clean; "" and NUL are invalid.
func sandboxPath(p, user string) (string, error) {
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return "", rpcErr(codeInvalidArgument, "invalid path %q", p)
	}
	home := Home
	if user == "root" {
		home = "/root"
	}
	switch {
	case p == "~":
		p = home
	case strings.HasPrefix(p, "~/"):
		p = path.Join(home, p[2:])
	case !strings.HasPrefix(p, "/"):
		p = path.Join(home, p)
	}
	return path.Clean(p), nil
}

// withRoot opens the sandbox's root and runs fn on it as the sandbox's
// root user.
func (s *Server) withRoot(sb *sandbox, fn func(r *rootfs.Root) error) error {
	s.mu.Lock()
	dir, paused := sb.attempt.Root, sb.paused != ""
	s.mu.Unlock()
	if paused || dir == "" {
		return rpcErr(codeUnavailable, "sandbox %s is not running", sb.id)
	}
	r, err := rootfs.Open(dir, rootfs.Options{})
	if err != nil {
		return rpcErr(codeUnavailable, "sandbox %s: %v", sb.id, err)
	}
	defer r.Close()
	return asSandboxRoot(s.opts.RootUID, func() error { return fn(r) })
}

// fsError maps a file system error to a Connect error.
func fsError(op, p string, err error) error {
	var re *rpcError
	if errors.As(err, &re) {
		return re
	}
	switch {
	case errors.Is(err, unix.ENOENT):
		return rpcErr(codeNotFound, "%s %s: no such file or directory", op, p)
	case errors.Is(err, unix.EEXIST):
		return rpcErr(codeAlreadyExists, "%s %s: already exists", op, p)
	case errors.Is(err, unix.ENOTDIR):
		return rpcErr(codeInvalidArgument, "%s %s: not a directory", op, p)
	case errors.Is(err, unix.EISDIR):
		return rpcErr(codeInvalidArgument, "%s %s: is a directory", op, p)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return rpcErr(codePermissionDenied, "%s %s: permission denied", op, p)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return rpcErr(codeResourceExhausted, "%s %s: no space left", op, p)
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ELOOP):
		return rpcErr(codePermissionDenied, "%s %s: leaves the sandbox", op, p)
	}
	return rpcErr(codeInternal, "%s %s: %v", op, p, err)
}

// entryAt describes name in the directory dirfd (not following a final
// symlink); p is its sandbox path.
func entryAt(dirfd int, name, p string, shift uint32) (*envdwire.EntryInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, err
	}
	mode := rootfs.FileMode(st.Mode)
	e := &envdwire.EntryInfo{Name: path.Base(p), Path: p, Size: envdwire.Int64(st.Size), Mode: uint32(mode.Perm()),
		Permissions: mode.String(), Owner: idName(st.Uid, shift), Group: idName(st.Gid, shift)}
	if p == "/" {
		e.Name = "/"
	}
	mt := time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC()
	e.ModifiedTime = &mt
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		e.Type = envdwire.FileTypeDir
	case unix.S_IFLNK:
		e.Type = envdwire.FileTypeSymlink
		buf := make([]byte, unix.PathMax)
		if n, err := unix.Readlinkat(dirfd, name, buf); err == nil {
			t := string(buf[:n])
			e.SymlinkTarget = &t
		}
	default:
		e.Type = envdwire.FileTypeFile
	}
	return e, nil
}

// idName names a file's owner as the sandbox sees it: the mount shows
// host ids, shifted by the user namespace's start.
func idName(id, shift uint32) string {
	if shift != 0 && id >= shift {
		id -= shift
	}
	if id == 0 {
		return "root"
	}
	return strconv.FormatUint(uint64(id), 10)
}

// entry describes p inside r.
func entry(r *rootfs.Root, p string, shift uint32) (*envdwire.EntryInfo, error) {
	dfd, base, err := r.Parent(p)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	return entryAt(dfd, base, p, shift)
}

func (s *Server) fsStat(r *http.Request, req *envdwire.PathRequest) (*envdwire.EntryResponse, error) {
	sb, user, _ := s.envdCall(r)
	p, err := sandboxPath(req.Path, user)
	if err != nil {
		return nil, err
	}
	var out envdwire.EntryResponse
	err = s.withRoot(sb, func(root *rootfs.Root) error {
		e, err := entry(root, p, s.opts.RootUID)
		out.Entry = e
		return err
	})
	if err != nil {
		return nil, fsError("stat", p, err)
	}
	return &out, nil
}

// maxListDepth bounds ListDir's depth.
const maxListDepth = 64

func (s *Server) fsListDir(r *http.Request, req *envdwire.ListDirRequest) (*envdwire.ListDirResponse, error) {
	sb, user, _ := s.envdCall(r)
	p, err := sandboxPath(req.Path, user)
	if err != nil {
		return nil, err
	}
	depth := int(req.Depth)
	if depth == 0 {
		depth = 1
	}
	if depth > maxListDepth {
		depth = maxListDepth
	}
	out := &envdwire.ListDirResponse{}
	err = s.withRoot(sb, func(root *rootfs.Root) error {
		fd, err := root.OpenFD(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		return listAt(fd, p, depth, s.opts.RootUID, &out.Entries)
	})
	if err != nil {
		return nil, fsError("list", p, err)
	}
	return out, nil
}

// listAt lists the directory fd (closed here) named p, descending depth-1
// more levels into subdirectories (never through symlinks).
func listAt(fd int, p string, depth int, shift uint32, out *[]*envdwire.EntryInfo) error {
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		e, err := entryAt(fd, n, path.Join(p, n), shift)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed meanwhile
			}
			return err
		}
		*out = append(*out, e)
		if depth > 1 && e.Type == envdwire.FileTypeDir {
			sub, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				continue // unreadable: listed, not entered
			}
			if err := listAt(sub, e.Path, depth-1, shift, out); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Server) fsMakeDir(r *http.Request, req *envdwire.PathRequest) (*envdwire.EntryResponse, error) {
	sb, user, _ := s.envdCall(r)
	p, err := sandboxPath(req.Path, user)
	if err != nil {
		return nil, err
	}
	var out envdwire.EntryResponse
	err = s.withRoot(sb, func(root *rootfs.Root) error {
		if _, err := root.Lstat(p); err == nil {
			return rpcErr(codeAlreadyExists, "directory %s already exists", p)
		}
		fd, err := root.MkdirAll(p, 0o755)
		if err != nil {
			return err
		}
		unix.Close(fd)
		out.Entry, err = entry(root, p, s.opts.RootUID)
		return err
	})
	if err != nil {
		return nil, fsError("make directory", p, err)
	}
	return &out, nil
}

func (s *Server) fsMove(r *http.Request, req *envdwire.MoveRequest) (*envdwire.EntryResponse, error) {
	sb, user, _ := s.envdCall(r)
	src, err := sandboxPath(req.Source, user)
	if err != nil {
		return nil, err
	}
	dst, err := sandboxPath(req.Destination, user)
	if err != nil {
		return nil, err
	}
	var out envdwire.EntryResponse
	err = s.withRoot(sb, func(root *rootfs.Root) error {
		sfd, sbase, err := root.Parent(src)
		if err != nil {
			return err
		}
		defer unix.Close(sfd)
		if fd, err := root.MkdirAll(path.Dir(dst), 0o755); err == nil {
			unix.Close(fd)
		}
		dfd, dbase, err := root.Parent(dst)
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		if err := unix.Renameat(sfd, sbase, dfd, dbase); err != nil {
			return err
		}
		out.Entry, err = entryAt(dfd, dbase, dst, s.opts.RootUID)
		return err
	})
	if err != nil {
		return nil, fsError("move", src, err)
	}
	return &out, nil
}

func (s *Server) fsRemove(r *http.Request, req *envdwire.PathRequest) (*envdwire.Empty, error) {
	sb, user, _ := s.envdCall(r)
	p, err := sandboxPath(req.Path, user)
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, rpcErr(codeInvalidArgument, "refusing to remove /")
	}
	err = s.withRoot(sb, func(root *rootfs.Root) error {
		dfd, base, err := root.Parent(p)
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		return removeAt(dfd, base)
	})
	if err != nil {
		return nil, fsError("remove", p, err)
	}
	return &envdwire.Empty{}, nil
}

// removeAt removes name in dirfd and, for a directory, all it holds.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || (!errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM)) {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n); err != nil && !errors.Is(err, unix.ENOENT) {
				break
			}
			err = nil
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// /files: downloads and uploads. Authorised by the access token or by a
// signature (signed URLs), which also names the sandbox when the request
// carries no E2b-Sandbox-Id.

// signature is envd's URL signature of path, operation ("read" or
// "write"), user and token, with the expiry (unix seconds) if any.
func signature(p, op, user, token string, exp int64) string {
	s := p + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		s += ":" + strconv.FormatInt(exp, 10)
	}
	sum := sha256.Sum256([]byte(s))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// signedFor reports whether r's signature query authorises op with
// token, a sandbox's access token ("": unknown since a restart, so
// nothing verifies).
func signedFor(r *http.Request, token, op string) bool {
	if token == "" {
		return false
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return false
	}
	var exp int64
	if e := q.Get("signature_expiration"); e != "" {
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil || time.Now().Unix() > n {
			return false
		}
		exp = n
	}
	want := signature(q.Get("path"), op, q.Get("username"), token, exp)
	return subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1
}

func fileOp(method string) string {
	if method == http.MethodPost {
		return "write"
	}
	return "read"
}

// serveFiles serves /files for a request that passed no token check yet.
func (s *Server) serveFiles(w http.ResponseWriter, r *http.Request) {
	op := fileOp(r.Method)
	var sb *sandbox
	if id := r.Header.Get(envdwire.HeaderSandboxID); id != "" {
		var err error
		if sb, err = s.lookup(r.Context(), id); err != nil {
			writeGone(w, id)
			return
		}
		s.mu.Lock()
		tok := sb.token
		s.mu.Unlock()
		if !s.tokenOK(sb, r.Header.Get(envdwire.HeaderAccessToken)) && !signedFor(r, tok, op) {
			writeEnvdError(w, http.StatusUnauthorized, "invalid signature or access token")
			return
		}
	} else {
		// A signed URL names no sandbox: the one whose token makes the
		// signature is it.
		s.mu.Lock()
		for _, c := range s.sandboxes {
			if signedFor(r, c.token, op) {
				sb = c
				break
			}
		}
		s.mu.Unlock()
		if sb == nil {
			writeEnvdError(w, http.StatusUnauthorized, "invalid or expired signature")
			return
		}
	}
	user := r.URL.Query().Get("username")
	if user == "" {
		u, ok := basicUser(r.Header.Get("Authorization"))
		if !ok {
			writeEnvdError(w, http.StatusUnauthorized, "invalid authorization header")
			return
		}
		user = u
	}
	if user == "" {
		user = "user"
	}
	if user != "user" && user != "root" {
		writeEnvdError(w, http.StatusUnauthorized, "invalid username: '"+user+"'")
		return
	}
	var p string
	if q := r.URL.Query().Get("path"); q != "" || r.Method == http.MethodGet {
		var err error
		if p, err = sandboxPath(q, user); err != nil {
			writeEnvdError(w, http.StatusBadRequest, asRPC(err).Message)
			return
		}
	}
	if r.Method == http.MethodGet {
		s.download(w, sb, p)
	} else {
		s.upload(w, r, sb, p, user)
	}
}

func writeGone(w http.ResponseWriter, id string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	w.Write([]byte(`{"sandboxId":` + quote(id) + `,"message":"The sandbox was not found","code":502}`))
}

// httpStatusOf is the /files status of a file system error.
func httpStatusOf(err error) (int, string) {
	re := asRPC(fsError("", "", err))
	switch re.Code {
	case codeNotFound:
		return http.StatusNotFound, re.Message
	case codeInvalidArgument:
		return http.StatusBadRequest, re.Message
	case codePermissionDenied:
		return http.StatusForbidden, re.Message
	case codeResourceExhausted:
		return http.StatusInsufficientStorage, re.Message
	case codeUnavailable:
		return http.StatusBadGateway, re.Message
	}
	return http.StatusInternalServerError, re.Message
}

func (s *Server) download(w http.ResponseWriter, sb *sandbox, p string) {
	err := s.withRoot(sb, func(root *rootfs.Root) error {
		f, size, err := root.OpenRegular(p)
		if err != nil {
			if errors.Is(err, rootfs.ErrNotRegular) {
				return rpcErr(codeInvalidArgument, "%s is not a regular file", p)
			}
			return err
		}
		defer f.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
		w.WriteHeader(http.StatusOK)
		io.Copy(w, f)
		return nil
	})
	if err != nil {
		st, msg := httpStatusOf(err)
		writeEnvdError(w, st, msg)
	}
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request, sb *sandbox, p, user string) {
	var written []envdwire.UploadedEntry
	put := func(dst string, body io.Reader) error {
		return s.withRoot(sb, func(root *rootfs.Root) error {
			if fd, err := root.MkdirAll(path.Dir(dst), 0o755); err == nil {
				unix.Close(fd)
			} else {
				return err
			}
			f, err := root.OpenFile(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, body); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			written = append(written, envdwire.UploadedEntry{Name: path.Base(dst), Type: "file", Path: dst})
			return nil
		})
	}
	body := io.Reader(r.Body)
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeEnvdError(w, http.StatusBadRequest, "gzip body: "+err.Error())
			return
		}
		defer zr.Close()
		body = zr
	}
	var err error
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case mt == "multipart/form-data":
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, perr := mr.NextPart()
			if perr == io.EOF {
				break
			}
			if perr != nil {
				err = rpcErr(codeInvalidArgument, "multipart body: %v", perr)
				break
			}
			if part.FormName() != "file" {
				continue
			}
			dst := p
			if dst == "" {
				// The SDKs put the path in the part's filename; Go's
				// FileName keeps only its base, so read it whole.
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				if dst, err = sandboxPath(dp["filename"], user); err != nil {
					break
				}
			}
			if err = put(dst, part); err != nil {
				break
			}
		}
	case p == "":
		err = rpcErr(codeInvalidArgument, "no path")
	default:
		err = put(p, body)
	}
	if err != nil {
		st, msg := httpStatusOf(err)
		writeEnvdError(w, st, msg)
		return
	}
	if written == nil {
		written = []envdwire.UploadedEntry{}
	}
	writeJSON(w, http.StatusOK, written)
}
