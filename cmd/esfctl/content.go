package main

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/schollz/progressbar/v3"
	"github.com/urfave/cli/v3"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/atomicfile"
)

func (a *app) importCommand() *cli.Command {
	return &cli.Command{
		Name:      "import",
		Usage:     "import a directory, a tar or an OCI image and print its root_id",
		ArgsUsage: "SRC|-",
		Description: "SRC is a directory, a tar (plain, gzip, zstd), an OCI image layout or an\n" +
			"OCI/docker archive; the daemon reads it (a relative SRC is resolved here first).\n" +
			"- streams a tar from stdin instead. Prints the root_id on stdout and a summary\n" +
			"on stderr; with -o json prints the whole result.\n\n" +
			"Kept: type, mode (0000, setuid, setgid and sticky included), owner, mtime in\n" +
			"nanoseconds, every xattr (POSIX ACLs, security.capability), hard links, device\n" +
			"numbers, fifos, and the holes of sparse files (a tar's only when it stores\n" +
			"them sparse, as tar --sparse does). Left out: sockets, which a tree cannot\n" +
			"hold (a socket is a live endpoint, not content); each is named in a warning\n" +
			"and in \"skipped\".",
		Flags: []cli.Flag{idempotencyKeyFlag()},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			src := cmd.Args().First()
			var (
				res *v1.ImportResponse
				err error
			)
			if src == "-" {
				res, err = a.importStdin(ctx, a.callOptions(cmd))
			} else {
				res, err = a.importPath(ctx, src, a.callOptions(cmd))
			}
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(res)
			}
			fmt.Fprintln(a.stdout, res.RootID)
			for _, p := range res.Skipped {
				fmt.Fprintf(a.stderr, "esfctl: warning: skipped %s (not representable)\n", p)
			}
			fmt.Fprintf(a.stderr, "imported %d files, %d dirs, %d symlinks, %s (%d new objects, %s new)\n",
				res.Files, res.Dirs, res.Symlinks, humanBytes(res.Bytes), res.NewObjects, humanBytes(res.NewBytes))
			return nil
		}),
	}
}

func (a *app) importPath(ctx context.Context, src string, opt client.CallOptions) (*v1.ImportResponse, error) {
	abs, err := filepath.Abs(src)
	if err != nil {
		return nil, fmt.Errorf("import %s: %v: %w", src, err, errdefs.ErrInvalidArgument)
	}
	bar := a.spinner("importing " + abs)
	defer bar.Finish()
	return a.client.Import(ctx, abs, opt)
}

func (a *app) importStdin(ctx context.Context, opt client.CallOptions) (*v1.ImportResponse, error) {
	total := int64(-1)
	if f, ok := a.stdin.(*os.File); ok {
		if a.isTTY(f) {
			return nil, fmt.Errorf("import -: stdin is a terminal, want a tar stream: %w", errdefs.ErrInvalidArgument)
		}
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			total = fi.Size()
		}
	}
	bar := a.progress(total, "importing stdin")
	defer bar.Finish()
	return a.client.ImportTar(ctx, &stdinReader{r: a.stdin, bar: bar}, opt)
}

// stdinReader feeds the progress bar and names read errors as the reader's,
// not the daemon's.
type stdinReader struct {
	r   io.Reader
	bar *progressbar.ProgressBar
}

func (s *stdinReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.bar.Add(n)
	if err != nil && err != io.EOF {
		return n, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: fmt.Sprintf("import -: read stdin: %v", err)}
	}
	return n, err
}

func (a *app) exportCommand() *cli.Command {
	return &cli.Command{
		Name:      "export",
		Usage:     "write a tree out as a directory, a tar or a patch, with its provenance record",
		ArgsUsage: "ID --to DIR|FILE.tar|FILE.tar.zst|FILE.tar.gz|FILE|-",
		Description: "ID is a node id or a root id. --to DIR has the daemon write a directory that\n" +
			"must not exist or be empty (--artifact PATH: only that directory of the tree).\n" +
			"A --to ending in .tar, .tar.zst/.tzst or .tar.gz/.tgz streams a tar here,\n" +
			"compressed by suffix, and writes the file atomically (it appears only\n" +
			"complete). --format patch --base NODE writes a git patch from NODE to ID\n" +
			"instead. --to - writes the tar or patch to stdout. A directory keeps the\n" +
			"holes of sparse files; a tar writes them as zeros (docs/fidelity.md).\n\n" +
			"By default an export leaves out what could give privilege on this host:\n" +
			"setuid/setgid bits of files, security.* xattrs (file capabilities) and\n" +
			"device nodes; it says what it dropped. --preserve-privileged keeps them.\n\n" +
			"Every export to a directory or file also writes its signed provenance record,\n" +
			"to --provenance FILE or else beside it as DEST.provenance.json (to stdout:\n" +
			"only with --provenance). Check it with esfctl verify-provenance.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "to", Usage: "destination: DIR, FILE.tar[.zst|.gz], FILE (patch) or -", Required: true},
			&cli.StringFlag{Name: "format", Usage: "dir, tar or patch (default: tar for a tar file name or -, else dir)"},
			&cli.StringFlag{Name: "base", Usage: "with --format patch: the node or root the patch applies to"},
			&cli.StringFlag{Name: "artifact", Usage: "export only this directory (a slash path in the tree; --to DIR only)"},
			&cli.StringFlag{Name: "provenance", Usage: "where to write the provenance record (default DEST.provenance.json)"},
			&cli.BoolFlag{Name: "preserve-privileged", Usage: "keep setuid/setgid bits, security.* xattrs and device nodes"},
			idempotencyKeyFlag(),
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			id, to := cmd.Args().First(), cmd.String("to")
			if to == "" {
				return fmt.Errorf("export: empty --to: %w", errdefs.ErrInvalidArgument)
			}
			format := cmd.String("format")
			if format == "" {
				format = "dir"
				if to == "-" || tarFormat(to) != "" {
					format = "tar"
				}
			}
			base, artifact := cmd.String("base"), cmd.String("artifact")
			switch {
			case format != "dir" && format != "tar" && format != "patch":
				return fmt.Errorf("export --format %q: want dir, tar or patch: %w", format, errdefs.ErrInvalidArgument)
			case (format == "patch") != (base != ""):
				return fmt.Errorf("export: --base goes with --format patch, and only with it: %w", errdefs.ErrInvalidArgument)
			case artifact != "" && format != "dir":
				return fmt.Errorf("export --artifact: only to a directory: %w", errdefs.ErrInvalidArgument)
			case format == "dir" && (to == "-" || tarFormat(to) != ""):
				return fmt.Errorf("export --format dir --to %s: want a directory: %w", to, errdefs.ErrInvalidArgument)
			case format == "tar" && to != "-" && tarFormat(to) == "":
				return fmt.Errorf("export --format tar --to %s: want a name ending in .tar, .tar.zst or .tar.gz, or -: %w", to, errdefs.ErrInvalidArgument)
			}
			prov := cmd.String("provenance")
			if prov != "" {
				abs, err := filepath.Abs(prov)
				if err != nil {
					return fmt.Errorf("export --provenance %s: %v: %w", prov, err, errdefs.ErrInvalidArgument)
				}
				prov = abs
			}
			info := v1.ExportInfo{Format: format, Base: base}
			priv := client.ExportOptions{PreservePrivileged: cmd.Bool("preserve-privileged")}
			if priv.PreservePrivileged && format == "patch" {
				return fmt.Errorf("export --preserve-privileged: not with --format patch: %w", errdefs.ErrInvalidArgument)
			}
			switch {
			case format == "dir":
				return a.exportDir(ctx, v1.ExportNodeRequest{ID: id, To: to, Artifact: artifact, Provenance: prov,
					PreservePrivileged: priv.PreservePrivileged}, a.callOptions(cmd))
			case to == "-":
				return a.exportStdout(ctx, id, info, prov, priv)
			default:
				return a.exportFile(ctx, id, to, info, prov, priv)
			}
		}),
	}
}

// tarFormat is the compression a tar file name asks for ("tar", "zstd",
// "gzip"), or "" when the name is not a tar file.
func tarFormat(name string) string {
	switch n := strings.ToLower(name); {
	case strings.HasSuffix(n, ".tar"):
		return "tar"
	case strings.HasSuffix(n, ".tar.zst"), strings.HasSuffix(n, ".tzst"):
		return "zstd"
	case strings.HasSuffix(n, ".tar.gz"), strings.HasSuffix(n, ".tgz"):
		return "gzip"
	}
	return ""
}

func (a *app) exportDir(ctx context.Context, req v1.ExportNodeRequest, opt client.CallOptions) error {
	abs, err := filepath.Abs(req.To)
	if err != nil {
		return fmt.Errorf("export --to %s: %v: %w", req.To, err, errdefs.ErrInvalidArgument)
	}
	req.To = abs
	var raw []byte
	opt.Raw = &raw
	bar := a.spinner("exporting to " + abs)
	res, err := a.client.ExportNode(ctx, req, opt)
	bar.Finish()
	if err != nil {
		return err
	}
	if a.json {
		return a.printRaw(raw)
	}
	fmt.Fprintf(a.stdout, "exported %s to %s: %d files, %s; provenance %s\n",
		res.RootID, abs, res.Files, humanBytes(res.Bytes), res.Provenance)
	a.reportDropped(&res.Dropped)
	return nil
}

// reportDropped tells the user on stderr what an export left out because
// it could give privilege on the host (JSON output carries it as
// "dropped").
func (a *app) reportDropped(d *v1.Dropped) {
	if d == nil || !d.Any() {
		return
	}
	more := ""
	if n := d.SetID + d.Xattrs + d.Devices; int64(len(d.Paths)) < n && len(d.Paths) == v1.MaxDroppedPaths {
		more = ", ..."
	}
	fmt.Fprintf(a.stderr, "dropped %s (--preserve-privileged keeps them): %s%s\n",
		d.String(), strings.Join(d.Paths, ", "), more)
}

func (a *app) exportStdout(ctx context.Context, id string, info v1.ExportInfo, prov string, priv client.ExportOptions) error {
	if f, ok := a.stdout.(*os.File); ok && a.isTTY(f) {
		return fmt.Errorf("export --to -: stdout is a terminal, redirect it: %w", errdefs.ErrInvalidArgument)
	}
	// stdout carries the stream: no result is printed, even with -o json.
	var err error
	if info.Format == "patch" {
		_, err = a.client.Patch(ctx, info.Base, id, a.stdout)
	} else {
		var res *client.ExportTarResult
		if res, err = a.client.ExportTar(ctx, id, a.stdout, priv); err == nil {
			a.reportDropped(res.Dropped)
		}
	}
	if err != nil || prov == "" {
		return err
	}
	info.Destination = "-"
	return a.writeProvenance(ctx, id, info, prov)
}

// fileExport is the result of an export to a tar file.
type fileExport struct {
	RootID    string `json:"root_id"`
	To        string `json:"to"`
	Format    string `json:"format"`     // tar, zstd, gzip or patch
	TarBytes  int64  `json:"tar_bytes"`  // uncompressed stream
	FileBytes int64  `json:"file_bytes"` // what was written to the file
	// Provenance is where the record of the export was written.
	Provenance string `json:"provenance"`
	// Dropped is what a tar left out because it could give privilege on
	// the host (absent for a patch).
	Dropped *v1.Dropped `json:"dropped,omitempty"`
}

func (a *app) exportFile(ctx context.Context, id, to string, info v1.ExportInfo, prov string, priv client.ExportOptions) (err error) {
	abs, err := filepath.Abs(to)
	if err != nil {
		return fmt.Errorf("export --to %s: %v: %w", to, err, errdefs.ErrInvalidArgument)
	}
	format := tarFormat(abs)
	if info.Format == "patch" {
		format = "patch"
	}
	if prov == "" {
		prov = abs + ".provenance.json"
	}
	tmp, err := atomicfile.Create(abs, 0o666&^a.umask)
	if err != nil {
		return fmt.Errorf("export --to %s: %w", abs, localError(err))
	}
	defer tmp.Abort()
	file := &countingWriter{w: tmp}
	var (
		enc io.WriteCloser
		w   io.Writer = file
	)
	switch format {
	case "zstd":
		zw, err := zstd.NewWriter(file)
		if err != nil {
			return err
		}
		enc, w = zw, zw
	case "gzip":
		gw := gzip.NewWriter(file)
		enc, w = gw, gw
	}
	bar := a.progress(-1, "exporting to "+filepath.Base(abs))
	var res *client.ExportTarResult
	if format == "patch" {
		res, err = a.client.Patch(ctx, info.Base, id, io.MultiWriter(w, bar))
	} else {
		res, err = a.client.ExportTar(ctx, id, io.MultiWriter(w, bar), priv)
	}
	bar.Finish()
	if err != nil {
		if enc != nil {
			enc.Close()
		}
		return err
	}
	if enc != nil {
		if err := enc.Close(); err != nil {
			return fmt.Errorf("export --to %s: %w", abs, localError(err))
		}
	}
	if err := tmp.Commit(); err != nil {
		return fmt.Errorf("export --to %s: %w", abs, localError(err))
	}
	info.Destination = abs
	if err := a.writeProvenance(ctx, id, info, prov); err != nil {
		return err
	}
	out := fileExport{RootID: res.RootID, To: abs, Format: format, TarBytes: res.Bytes, FileBytes: file.n, Provenance: prov, Dropped: res.Dropped}
	if a.json {
		return a.printJSON(out)
	}
	fmt.Fprintf(a.stdout, "exported %s to %s (%s %s, %s written); provenance %s\n",
		out.RootID, out.To, humanBytes(out.TarBytes), info.Format, humanBytes(out.FileBytes), prov)
	a.reportDropped(res.Dropped)
	return nil
}

// localError classifies a failure of esfctl's own filesystem work.
func localError(err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%v: %w", err, errdefs.ErrNotFound)
	case errors.Is(err, os.ErrPermission), errors.Is(err, os.ErrExist):
		return fmt.Errorf("%v: %w", err, errdefs.ErrFailedPrecondition)
	}
	return err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// progress returns a byte counter drawn on stderr when it is a terminal and
// the output is for humans, and an invisible one otherwise. total -1 is a
// spinner. The caller ends it with Finish (which clears it and stops the spinner).
func (a *app) progress(total int64, desc string) *progressbar.ProgressBar {
	f, ok := a.stderr.(*os.File)
	visible := ok && !a.json && a.isTTY(f)
	var w io.Writer = io.Discard
	if visible {
		w = f
	}
	return progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetVisibility(visible),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowTotalBytes(true),
		progressbar.OptionSetWidth(20),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSpinnerType(14),
		progressbar.OptionClearOnFinish(),
	)
}

// spinner shows that a server-side operation is running.
func (a *app) spinner(desc string) *progressbar.ProgressBar {
	bar := a.progress(-1, desc)
	bar.RenderBlank()
	return bar
}
