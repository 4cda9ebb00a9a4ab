package osfake

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const execdTokenHeader = "X-EXECD-ACCESS-TOKEN"

// execd error codes (model/error.go).
const (
	codeInvalidRequest  = "INVALID_REQUEST_BODY"
	codeMissingQuery    = "MISSING_QUERY"
	codeRuntimeError    = "RUNTIME_ERROR"
	codeInvalidFile     = "INVALID_FILE"
	codeInvalidContent  = "INVALID_FILE_CONTENT"
	codeInvalidMetadata = "INVALID_FILE_METADATA"
	codeFileNotFound    = "FILE_NOT_FOUND"
)

func (s *Server) execdMux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "pong")
	})
	mux.HandleFunc("POST /command", s.runCommand)
	mux.HandleFunc("DELETE /command", s.interruptCommand)
	// /command/status/{id} and /command/{id}/logs overlap as mux patterns.
	mux.HandleFunc("GET /command/{a}/{b}", func(w http.ResponseWriter, r *http.Request) {
		switch a, b := r.PathValue("a"), r.PathValue("b"); {
		case a == "status":
			s.commandStatus(w, r, b)
		case b == "logs":
			s.commandLogs(w, r, a)
		default:
			http.NotFound(w, r)
		}
	})
	mux.HandleFunc("GET /files/info", s.filesInfo)
	mux.HandleFunc("DELETE /files", s.removeFiles)
	mux.HandleFunc("POST /files/mv", s.moveFiles)
	mux.HandleFunc("POST /files/permissions", s.chmodFiles)
	mux.HandleFunc("GET /files/search", s.searchFiles)
	mux.HandleFunc("POST /files/upload", s.uploadFiles)
	mux.HandleFunc("GET /files/download", s.downloadFile)
	mux.HandleFunc("GET /directories/list", s.listDirectory)
	mux.HandleFunc("POST /directories", s.makeDirs)
	mux.HandleFunc("DELETE /directories", s.removeDirs)
	return mux
}

func sandboxOf(r *http.Request) *sandbox { return r.Context().Value(sandboxKey{}).(*sandbox) }

// execdError writes execd's {"code","message"}.
func execdError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"code": code, "message": msg})
}

// fileError is execd's handleFileError: missing is 404, the rest 500.
func fileError(w http.ResponseWriter, err error) {
	if errors.Is(err, fs.ErrNotExist) {
		execdError(w, http.StatusNotFound, codeFileNotFound, "file not found. "+err.Error())
		return
	}
	execdError(w, http.StatusInternalServerError, codeRuntimeError, "error accessing file: "+err.Error())
}

// host maps a sandbox path onto the host: the sandbox's "/" is its root
// directory. Cleaning under "/" keeps ".." inside the root.
func (sb *sandbox) host(p string) string {
	return filepath.Join(sb.root, filepath.Clean("/"+p))
}

// guest is the sandbox path of a host path under the root.
func (sb *sandbox) guest(h string) string {
	rel, err := filepath.Rel(sb.root, h)
	if err != nil || rel == "." {
		return "/"
	}
	return "/" + filepath.ToSlash(rel)
}

// execdEnv is execd's own environment as the sandbox sees it: the image's
// (here PATH and HOME) overlaid by the create request's env.
func (s *Server) execdEnv(sb *sandbox) map[string]string {
	env := map[string]string{"HOME": s.opts.Home, "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for k, v := range sb.env {
		env[k] = v
	}
	return env
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// expand is execd's path expansion (pathutil.ExpandPathWithEnv plus
// filepath.Abs): $VAR and ${VAR} are substituted from execd's environment
// (an undefined one is an error), a leading "~" becomes HOME, and a
// relative result is taken from "/", execd's working directory.
func (s *Server) expand(sb *sandbox, p string, extra map[string]string) (string, error) {
	env := s.execdEnv(sb)
	for k, v := range extra {
		env[k] = v
	}
	var missing []string
	for _, m := range envRef.FindAllStringSubmatch(p, -1) {
		name := m[1]
		if name == "" {
			name = m[2]
		}
		if _, ok := env[name]; !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return "", fmt.Errorf("path references undefined environment variables: %s", strings.Join(missing, ","))
	}
	p = os.Expand(p, func(k string) string { return env[k] })
	switch {
	case p == "~":
		p = env["HOME"]
	case strings.HasPrefix(p, "~/"):
		p = path.Join(env["HOME"], p[2:])
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return path.Clean(p), nil
}

// fileInfoJSON is execd's FileInfo.
type fileInfoJSON struct {
	Path       string    `json:"path"`
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modified_at"`
	CreatedAt  time.Time `json:"created_at"`
	Owner      string    `json:"owner"`
	Group      string    `json:"group"`
	Mode       int       `json:"mode"`
}

func buildInfo(guestPath string, fi fs.FileInfo) fileInfoJSON {
	out := fileInfoJSON{Path: guestPath, Size: fi.Size(), ModifiedAt: fi.ModTime(), CreatedAt: fi.ModTime()}
	switch m := fi.Mode(); {
	case m&fs.ModeSymlink != 0:
		out.Type = "symlink"
	case m.IsDir():
		out.Type = "directory"
	case m.IsRegular():
		out.Type = "file"
	default:
		out.Type = "other"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		out.CreatedAt = time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
		out.Owner = strconv.FormatUint(uint64(st.Uid), 10)
		if u, err := user.LookupId(out.Owner); err == nil {
			out.Owner = u.Username
		}
		out.Group = strconv.FormatUint(uint64(st.Gid), 10)
		if g, err := user.LookupGroupId(out.Group); err == nil {
			out.Group = g.Name
		}
	}
	out.Mode, _ = strconv.Atoi(strconv.FormatUint(uint64(fi.Mode().Perm()), 8))
	return out
}

// parseMode reads execd's octal-digits mode (755 is 0755).
func parseMode(m int) (fs.FileMode, error) {
	n, err := strconv.ParseUint(strconv.Itoa(m), 8, 32)
	return fs.FileMode(n), err
}

func (s *Server) filesInfo(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	out := map[string]fileInfoJSON{}
	for _, p := range r.URL.Query()["path"] {
		abs, err := s.expand(sb, p, nil)
		if err != nil {
			fileError(w, fmt.Errorf("invalid path %s: %w", p, err))
			return
		}
		fi, err := os.Lstat(sb.host(abs))
		if err != nil {
			fileError(w, fmt.Errorf("file not found: %s: %w", p, err))
			return
		}
		out[p] = buildInfo(abs, fi)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listDirectory(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	q := r.URL.Query()
	p := q.Get("path")
	if p == "" {
		execdError(w, http.StatusBadRequest, codeMissingQuery, "missing query parameter 'path'")
		return
	}
	depth := 1
	if raw := q.Get("depth"); raw != "" {
		d, err := strconv.Atoi(raw)
		if err != nil || d < 0 {
			execdError(w, http.StatusBadRequest, codeInvalidRequest, "invalid query parameter 'depth': "+raw)
			return
		}
		depth = d
	}
	abs, err := s.expand(sb, p, nil)
	if err != nil {
		execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("error converting path %s to absolute. %v", p, err))
		return
	}
	fi, err := os.Lstat(sb.host(abs))
	switch {
	case err != nil:
		fileError(w, err)
		return
	case fi.Mode()&fs.ModeSymlink != 0:
		execdError(w, http.StatusBadRequest, codeInvalidRequest, "path is a symbolic link, refusing to traverse: "+abs)
		return
	case !fi.IsDir():
		execdError(w, http.StatusBadRequest, codeInvalidRequest, "path is not a directory: "+abs)
		return
	}
	entries := []fileInfoJSON{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		des, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, de := range des {
			hp := filepath.Join(dir, de.Name())
			info, err := de.Info()
			if err != nil {
				return err
			}
			entries = append(entries, buildInfo(sb.guest(hp), info))
			if de.IsDir() && level+1 < depth {
				if err := walk(hp, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if depth > 0 {
		if err := walk(sb.host(abs), 0); err != nil {
			execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("error listing directory %s. %v", abs, err))
			return
		}
	}
	writeJSON(w, http.StatusOK, entries)
}

func (s *Server) downloadFile(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	p := r.URL.Query().Get("path")
	if p == "" {
		execdError(w, http.StatusBadRequest, codeMissingQuery, "missing query parameter 'path'")
		return
	}
	abs, err := s.expand(sb, p, nil)
	if err != nil {
		execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("error resolving file path: %s. %v", p, err))
		return
	}
	f, err := os.Open(sb.host(abs))
	if err != nil {
		fileError(w, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("error getting file stat info: %s. %v", abs, err))
		return
	}
	if fi.IsDir() {
		// execd serves the open directory and fails on the first read, in
		// a way that depends on the filesystem; the fake fails cleanly.
		execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("read %s: is a directory", abs))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="`+path.Base(abs)+`"`)
	http.ServeContent(w, r, path.Base(abs), fi.ModTime(), f)
}

type fileMetadata struct {
	Path  string `json:"path"`
	Owner string `json:"owner"`
	Group string `json:"group"`
	Mode  int    `json:"mode"`
}

// uploadFiles is POST /files/upload. execd parses the whole multipart form
// first (gin spools file parts to disk) and only then writes the targets,
// so an upload cut short changes nothing; the fake streams parts to its
// spool directory the same way. Parts without a filename are form values,
// not files, and are not looked at: a metadata part must carry one.
func (s *Server) uploadFiles(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	mr, err := r.MultipartReader()
	if err != nil {
		execdError(w, http.StatusBadRequest, codeInvalidFile, "multipart form is empty")
		return
	}
	var metas [][]byte
	var spooled []string
	defer func() {
		for _, f := range spooled {
			os.Remove(f)
		}
	}()
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			execdError(w, http.StatusBadRequest, codeInvalidFile, "multipart form is empty")
			return
		}
		if part.FileName() == "" {
			_, _ = io.Copy(io.Discard, part)
			continue
		}
		switch part.FormName() {
		case "metadata":
			b, err := io.ReadAll(io.LimitReader(part, 1<<20))
			if err != nil {
				execdError(w, http.StatusBadRequest, codeInvalidFile, "multipart form is empty")
				return
			}
			metas = append(metas, b)
		case "file":
			f, err := os.CreateTemp(sb.spool, "upload-*")
			if err != nil {
				execdError(w, http.StatusInternalServerError, codeRuntimeError, err.Error())
				return
			}
			spooled = append(spooled, f.Name())
			_, err = io.CopyBuffer(f, part, make([]byte, 1<<20))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				execdError(w, http.StatusBadRequest, codeInvalidFile, "multipart form is empty")
				return
			}
		default:
			_, _ = io.Copy(io.Discard, part)
		}
	}
	switch {
	case len(metas) == 0:
		execdError(w, http.StatusBadRequest, codeInvalidMetadata, "metadata file is missing")
		return
	case len(spooled) == 0:
		execdError(w, http.StatusBadRequest, codeInvalidContent, "file is missing")
		return
	case len(metas) != len(spooled):
		execdError(w, http.StatusBadRequest, codeInvalidFile, fmt.Sprintf("metadata and file count mismatch: %d vs %d", len(metas), len(spooled)))
		return
	}
	for i, raw := range metas {
		var meta fileMetadata
		if err := json.Unmarshal(raw, &meta); err != nil {
			execdError(w, http.StatusBadRequest, codeInvalidMetadata, "invalid metadata format. "+err.Error())
			return
		}
		if meta.Path == "" {
			execdError(w, http.StatusBadRequest, codeInvalidMetadata, "metadata path is empty")
			return
		}
		abs, err := s.expand(sb, meta.Path, nil)
		if err != nil {
			execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("error resolving target path %s. %v", meta.Path, err))
			return
		}
		target := sb.host(abs)
		if err := os.MkdirAll(filepath.Dir(target), 0o777); err != nil {
			execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("error creating target directory %s. %v", path.Dir(abs), err))
			return
		}
		if err := placeUpload(spooled[i], target, meta.Mode); err != nil {
			execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("error writing file %s. %v", abs, err))
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

// placeUpload puts a spooled part at target the way execd does: truncate
// and copy into an existing file (keeping it, so readers can see a partial
// write), create a new one; then chmod unless mode is 0. A new target is
// renamed into place instead of copied: the same outcome, half the I/O.
func placeUpload(spool, target string, mode int) error {
	m, err := parseMode(mode)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
		if err := os.Rename(spool, target); err != nil {
			return err
		}
		if mode == 0 {
			m = 0o755 // 0777 under the usual 022 umask
		}
		return os.Chmod(target, m)
	}
	src, err := os.Open(spool)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o777)
	if err != nil {
		return err
	}
	_, err = io.Copy(dst, src)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil || mode == 0 {
		return err
	}
	return os.Chmod(target, m)
}

// removeFiles is DELETE /files: missing paths are fine, directories are
// refused, and the check follows symlinks (os.Stat), as execd's does.
func (s *Server) removeFiles(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	for _, p := range r.URL.Query()["path"] {
		err := func() error {
			abs, err := s.expand(sb, p, nil)
			if err != nil {
				return fmt.Errorf("invalid path: %w", err)
			}
			fi, err := os.Stat(sb.host(abs))
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			if fi.IsDir() {
				return fmt.Errorf("path is a directory: %s", p)
			}
			return os.Remove(sb.host(abs))
		}()
		if err != nil {
			execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("error removing file %s. %v", p, err))
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

type moveItem struct {
	Src  string `json:"src"`
	Dest string `json:"dest"`
}

// moveFiles is POST /files/mv; it refuses an existing destination.
func (s *Server) moveFiles(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	var items []moveItem
	if err := json.NewDecoder(r.Body).Decode(&items); err != nil {
		execdError(w, http.StatusBadRequest, codeInvalidRequest, "error parsing request, MAYBE invalid body format. "+err.Error())
		return
	}
	for _, it := range items {
		src, err := s.expand(sb, it.Src, nil)
		if err != nil {
			fileError(w, fmt.Errorf("invalid source path: %w", err))
			return
		}
		dst, err := s.expand(sb, it.Dest, nil)
		if err != nil {
			fileError(w, fmt.Errorf("invalid destination path: %w", err))
			return
		}
		if _, err := os.Stat(sb.host(src)); errors.Is(err, fs.ErrNotExist) {
			fileError(w, fmt.Errorf("source path not found: %s: %w", it.Src, err))
			return
		}
		if err := os.MkdirAll(filepath.Dir(sb.host(dst)), 0o755); err != nil {
			fileError(w, fmt.Errorf("failed to create destination directory: %w", err))
			return
		}
		if _, err := os.Stat(sb.host(dst)); err == nil {
			fileError(w, fmt.Errorf("destination path already exists: %s", it.Dest))
			return
		}
		if err := os.Rename(sb.host(src), sb.host(dst)); err != nil {
			fileError(w, fmt.Errorf("failed to rename file: %w", err))
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

type permission struct {
	Owner string `json:"owner"`
	Group string `json:"group"`
	Mode  int    `json:"mode"`
}

func (s *Server) chmodFiles(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	var req map[string]permission
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		execdError(w, http.StatusBadRequest, codeInvalidRequest, "error parsing request, MAYBE invalid body format. "+err.Error())
		return
	}
	for p, perm := range req {
		if err := s.chmod(sb, p, perm.Mode); err != nil {
			execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("error changing permissions for %s. %v", p, err))
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) chmod(sb *sandbox, p string, mode int) error {
	abs, err := s.expand(sb, p, nil)
	if err != nil {
		return err
	}
	if mode == 0 {
		_, err := os.Stat(sb.host(abs))
		return err
	}
	m, err := parseMode(mode)
	if err != nil {
		return err
	}
	return os.Chmod(sb.host(abs), m)
}

// makeDirs is POST /directories: mkdir -p, then the mode.
func (s *Server) makeDirs(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	var req map[string]permission
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		execdError(w, http.StatusBadRequest, codeInvalidRequest, "error parsing request, MAYBE invalid body format. "+err.Error())
		return
	}
	for p, perm := range req {
		abs, err := s.expand(sb, p, nil)
		if err != nil {
			fileError(w, err)
			return
		}
		if err := os.MkdirAll(sb.host(abs), 0o777); err != nil {
			fileError(w, err)
			return
		}
		if err := s.chmod(sb, abs, perm.Mode); err != nil {
			fileError(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

// removeDirs is DELETE /directories: rm -rf, missing is fine.
func (s *Server) removeDirs(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	for _, p := range r.URL.Query()["path"] {
		abs, err := s.expand(sb, p, nil)
		if err != nil {
			execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("error resolving directory %s. %v", p, err))
			return
		}
		if abs == "/" {
			// Removing the root would remove the fake's bookkeeping too;
			// execd would empty the container. Empty it.
			des, _ := os.ReadDir(sb.root)
			for _, de := range des {
				os.RemoveAll(filepath.Join(sb.root, de.Name()))
			}
			continue
		}
		if err := os.RemoveAll(sb.host(abs)); err != nil {
			execdError(w, http.StatusInternalServerError, codeRuntimeError, fmt.Sprintf("error removing directory %s. %v", p, err))
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

// searchFiles is GET /files/search: a walk matching pattern against base
// names, directories left out.
func (s *Server) searchFiles(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	q := r.URL.Query()
	p := q.Get("path")
	if p == "" {
		execdError(w, http.StatusBadRequest, codeMissingQuery, "missing query parameter 'path'")
		return
	}
	abs, err := s.expand(sb, p, nil)
	if err != nil {
		execdError(w, http.StatusInternalServerError, codeRuntimeError, err.Error())
		return
	}
	if _, err := os.Stat(sb.host(abs)); err != nil {
		fileError(w, err)
		return
	}
	pattern := q.Get("pattern")
	if pattern == "" {
		pattern = "**"
	}
	pattern = strings.ReplaceAll(pattern, "**", "*")
	out := []fileInfoJSON{}
	err = filepath.Walk(sb.host(abs), func(hp string, fi fs.FileInfo, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.IsDir() {
			return nil
		}
		ok, err := filepath.Match(pattern, fi.Name())
		if err != nil {
			return fmt.Errorf("invalid pattern %s: %w", pattern, err)
		}
		if ok {
			out = append(out, buildInfo(sb.guest(hp), fi))
		}
		return nil
	})
	if err != nil {
		execdError(w, http.StatusInternalServerError, codeRuntimeError, "error searching files. "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, out)
}
