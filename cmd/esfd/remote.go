package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/urfave/cli/v3"

	s3store "github.com/esf-dev/esf/cas/s3"
)

// remoteFlags choose the remote content store; serve takes them all, the
// projection server only --cas-remote.
func remoteFlags() []cli.Flag {
	return []cli.Flag{
		casRemoteFlag(),
		&cli.StringFlag{
			Name: "remote-durability",
			Usage: "with --cas-remote: sync answers a seal only once its new objects are durable in the remote; " +
				"async once they are committed locally and queued (in <state>/upload-queue, surviving restarts) for upload",
			Value:   "sync",
			Sources: cli.EnvVars("ESF_REMOTE_DURABILITY"),
		},
		&cli.StringFlag{
			Name: "cache-size",
			Usage: "with --cas-remote: bound on the local store's bytes, e.g. 50G; least recently used objects " +
				"that are in the remote leave it, those of live attempts stay (empty: unbounded)",
			Sources: cli.EnvVars("ESF_CACHE_SIZE"),
		},
	}
}

func casRemoteFlag() cli.Flag {
	return &cli.StringFlag{
		Name: "cas-remote",
		Usage: "content on an S3-compatible store, s3://BUCKET/PREFIX?endpoint=URL&region=REGION: the local store " +
			"becomes a verified cache in front of it (credentials from the standard AWS variables and files)",
		Sources: cli.EnvVars("ESF_CAS_REMOTE"),
	}
}

// openRemote opens the --cas-remote store, or returns nil without one.
func openRemote(ctx context.Context, cmd *cli.Command, state string, log *slog.Logger) (*s3store.Store, error) {
	raw := cmd.String("cas-remote")
	if raw == "" {
		return nil, nil
	}
	// The projection server has no --remote-durability: it only reads.
	if d := cmd.String("remote-durability"); d != "" && d != "sync" && d != "async" {
		return nil, fmt.Errorf("--remote-durability %q: want sync or async", d)
	}
	u, err := s3store.ParseURL(raw)
	if err != nil {
		return nil, fmt.Errorf("--cas-remote: %w", err)
	}
	c, err := s3store.NewClient(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("--cas-remote: %w", err)
	}
	// Large objects of a Put spool beside the state, not in a tmpfs.
	st, err := s3store.New(s3store.Options{Client: c, Bucket: u.Bucket, Prefix: u.Prefix, TempDir: filepath.Join(state, "tmp")})
	if err != nil {
		return nil, err
	}
	log.Info("content on a remote store", "remote", st.Location(), "endpoint", u.Endpoint, "durability", cmd.String("remote-durability"))
	return st, nil
}
