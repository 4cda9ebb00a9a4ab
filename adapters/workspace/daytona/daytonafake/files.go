package daytonafake

import (
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// daemon dispatches a toolbox request to the daemon handler gin would pick.
func (s *Server) daemon(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	p := strings.TrimSuffix(r.URL.Path, "/")
	m := r.Method
	switch {
	case p == "/files" && m == http.MethodGet:
		listFiles(w, r, sb)
	case p == "/files" && m == http.MethodDelete:
		deleteFile(w, r, sb)
	case p == "/files/info" && m == http.MethodGet:
		fileInfo(w, r, sb)
	case p == "/files/download" && m == http.MethodGet:
		downloadFile(w, r, sb)
	case p == "/files/upload-v2" && m == http.MethodPost:
		uploadFile(w, r, sb)
	case p == "/files/folder" && m == http.MethodPost:
		createFolder(w, r, sb)
	case p == "/files/move" && m == http.MethodPost:
		moveFile(w, r, sb)
	case p == "/files/permissions" && m == http.MethodPost:
		setPermissions(w, r, sb)
	case p == "/process/execute" && m == http.MethodPost:
		s.execute(w, r, sb)
	case p == "/process/session" && m == http.MethodPost:
		s.createSession(w, r, sb)
	case strings.HasPrefix(p, "/process/session/"):
		s.sessionRoute(w, r, sb, strings.Split(strings.TrimPrefix(p, "/process/session/"), "/"))
	case (p == "/user-home-dir" || p == "/work-dir") && m == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]string{"dir": sb.home})
	case p == "/version" && m == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]string{"version": "v0.0.0-fake"})
	default:
		http.Error(w, "404 page not found", http.StatusNotFound)
	}
}

// mounted are the sandbox directories backed by the sandbox's root on the
// host; commands see them at the same paths through a private mount
// namespace (see process.go).
var mounted = []string{"/home", "/tmp"}

// hostPath maps a toolbox path to the host. Relative paths start at the
// daemon's working directory (the home). Paths outside the mounted
// directories are refused like a permission error, so the file API never
// reaches the host's own files.
func (sb *sandbox) hostPath(p string) (string, bool) {
	if !path.IsAbs(p) {
		p = path.Join(sb.home, p)
	}
	p = path.Clean(p)
	for _, m := range mounted {
		if p == m || strings.HasPrefix(p, m+"/") {
			return filepath.Join(sb.root, filepath.FromSlash(p)), true
		}
	}
	return "", false
}

// sandboxPath is the inverse of hostPath.
func (sb *sandbox) sandboxPath(host string) string {
	rel, err := filepath.Rel(sb.root, host)
	if err != nil {
		return host
	}
	return "/" + filepath.ToSlash(rel)
}

// pathParam reads a required path query parameter, answering 400 (empty)
// or 403 (outside the sandbox) itself when it fails.
func (sb *sandbox) pathParam(w http.ResponseWriter, r *http.Request, name string) (string, bool) {
	v := r.URL.Query().Get(name)
	if v == "" {
		abort(w, http.StatusBadRequest)
		return "", false
	}
	p, ok := sb.hostPath(v)
	if !ok {
		abort(w, http.StatusForbidden)
		return "", false
	}
	return p, true
}

type fileInfoDTO struct {
	Name        string    `json:"name"`
	Path        string    `json:"path,omitempty"`
	Size        int64     `json:"size"`
	Mode        string    `json:"mode"`
	ModTime     string    `json:"modTime"`
	ModifiedAt  time.Time `json:"modifiedAt"`
	IsDir       bool      `json:"isDir"`
	Owner       string    `json:"owner"`
	Group       string    `json:"group"`
	Permissions string    `json:"permissions"`
}

// statInfo follows symlinks, as the daemon's os.Stat does.
func (sb *sandbox) statInfo(p string) (fileInfoDTO, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return fileInfoDTO{}, err
	}
	d := fileInfoDTO{
		Name: fi.Name(), Path: sb.sandboxPath(p), Size: fi.Size(), Mode: fi.Mode().String(),
		ModTime: fi.ModTime().String(), ModifiedAt: fi.ModTime(), IsDir: fi.IsDir(),
		Permissions: fmt.Sprintf("%04o", fi.Mode().Perm()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		d.Owner = strconv.FormatUint(uint64(st.Uid), 10)
		d.Group = strconv.FormatUint(uint64(st.Gid), 10)
	}
	return d, nil
}

func listFiles(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	dir := r.URL.Query().Get("path")
	if dir == "" {
		dir = "."
	}
	p, ok := sb.hostPath(dir)
	if !ok {
		abort(w, http.StatusForbidden)
		return
	}
	depth := 1
	if v := r.URL.Query().Get("depth"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			abort(w, http.StatusBadRequest)
			return
		}
		depth = n
	}
	out := []fileInfoDTO{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			info, err := sb.statInfo(p)
			if err != nil {
				continue // the daemon drops entries it cannot stat (dangling links)
			}
			out = append(out, info)
			if info.IsDir && level < depth {
				walk(p, level+1)
			}
		}
		return nil
	}
	if err := walk(p, 1); err != nil {
		abortFor(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func fileInfo(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	p, ok := sb.pathParam(w, r, "path")
	if !ok {
		return
	}
	info, err := sb.statInfo(p)
	if err != nil {
		abortFor(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func downloadFile(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	p, ok := sb.pathParam(w, r, "path")
	if !ok {
		return
	}
	f, err := os.Open(p)
	if err != nil {
		abortFor(w, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		abortFor(w, err)
		return
	}
	if fi.IsDir() {
		abort(w, http.StatusBadRequest) // "path must be a file"
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": fi.Name()}))
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

// uploadFile is upload-v2: a multipart field "file" or a raw body, parent
// directories created, the destination truncated and written in place
// (not atomically, like the daemon). The body streams to disk.
func uploadFile(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	p, ok := sb.pathParam(w, r, "path")
	if !ok {
		return
	}
	var src io.Reader = r.Body
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "multipart/form-data" {
		mr, err := r.MultipartReader()
		if err != nil {
			abort(w, http.StatusBadRequest)
			return
		}
		for {
			part, err := mr.NextPart()
			if err != nil {
				abort(w, http.StatusBadRequest) // http: no such file
				return
			}
			if part.FormName() == "file" {
				src = part
				break
			}
		}
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		abortFor(w, err)
		return
	}
	f, err := os.Create(p)
	if err != nil {
		abortFor(w, err)
		return
	}
	_, err = io.Copy(f, src)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		abort(w, http.StatusBadRequest)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"name": filepath.Base(p), "path": sb.sandboxPath(p), "type": "file"})
}

func createFolder(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	p, ok := sb.pathParam(w, r, "path")
	if !ok {
		return
	}
	perm := os.FileMode(0o755)
	if v := r.URL.Query().Get("mode"); v != "" {
		n, err := strconv.ParseUint(v, 8, 32)
		if err != nil {
			abort(w, http.StatusBadRequest)
			return
		}
		perm = os.FileMode(n)
	}
	if err := os.MkdirAll(p, perm); err != nil {
		abort(w, http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

func deleteFile(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	p, ok := sb.pathParam(w, r, "path")
	if !ok {
		return
	}
	for _, m := range mounted {
		if p == filepath.Join(sb.root, m) {
			abort(w, http.StatusForbidden) // a mount point is busy
			return
		}
	}
	recursive := r.URL.Query().Get("recursive") == "true"
	fi, err := os.Stat(p)
	if err != nil {
		abortFor(w, err)
		return
	}
	if fi.IsDir() && !recursive {
		abort(w, http.StatusBadRequest) // cannot delete directory without recursive flag
		return
	}
	if recursive {
		err = os.RemoveAll(p)
	} else {
		err = os.Remove(p)
	}
	if err != nil {
		abort(w, http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func moveFile(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	src, ok := sb.pathParam(w, r, "source")
	if !ok {
		return
	}
	dst, ok := sb.pathParam(w, r, "destination")
	if !ok {
		return
	}
	if _, err := os.Stat(src); err != nil {
		abortFor(w, err)
		return
	}
	if _, err := os.Stat(filepath.Dir(dst)); err != nil {
		abortFor(w, err)
		return
	}
	if _, err := os.Stat(dst); err == nil {
		abort(w, http.StatusConflict) // destination already exists
		return
	}
	if err := os.Rename(src, dst); err != nil {
		abort(w, http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func setPermissions(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	p, ok := sb.pathParam(w, r, "path")
	if !ok {
		return
	}
	if _, err := os.Stat(p); err != nil {
		abortFor(w, err)
		return
	}
	if v := r.URL.Query().Get("mode"); v != "" {
		n, err := strconv.ParseUint(v, 8, 32)
		if err != nil {
			abort(w, http.StatusBadRequest)
			return
		}
		if err := os.Chmod(p, os.FileMode(n)); err != nil {
			abort(w, http.StatusBadRequest)
			return
		}
	}
	if r.URL.Query().Get("owner") != "" || r.URL.Query().Get("group") != "" {
		abort(w, http.StatusBadRequest) // the fake runs as one user
		return
	}
	w.WriteHeader(http.StatusOK)
}
