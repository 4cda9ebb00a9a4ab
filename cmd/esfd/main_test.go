package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/api/client"
)

// TestServeDefaultsAndStop runs the daemon in process with only --state:
// the socket goes to <state>/esfd.sock, answers, and is removed when the
// context (the signal, in main) ends.
func TestServeDefaultsAndStop(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	t.Setenv("ESF_SOCKET", "")
	t.Setenv("ESF_LOG_LEVEL", "error")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root().Run(ctx, []string{"esfd", "--state", state}) }()

	sock := filepath.Join(state, "esfd.sock")
	c := client.NewClient(sock)
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.Status(ctx)
		if err == nil {
			if st.StateDir != state {
				t.Fatalf("state dir %s, want %s", st.StateDir, state)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon not answering on %s: %v", sock, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop")
	}
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left behind: %v", err)
	}
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"esfd", "--state", t.TempDir(), "--log-level", "loud"},
		{"esfd", "--state", t.TempDir(), "stray-argument"},
	} {
		if err := root().Run(context.Background(), args); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// TestStopAllNeedsAStoppedDaemon: stop-all takes the state lock, so it
// refuses while a daemon runs and succeeds (with nothing to stop) after.
func TestStopAllNeedsAStoppedDaemon(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	t.Setenv("ESF_SOCKET", "")
	t.Setenv("ESF_LOG_LEVEL", "error")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root().Run(ctx, []string{"esfd", "--state", state}) }()
	c := client.NewClient(filepath.Join(state, "esfd.sock"))
	defer c.Close()
	waitServing(t, c)

	err := root().Run(context.Background(), []string{"esfd", "stop-all", "--state", state})
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("stop-all while esfd runs: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if err := root().Run(context.Background(), []string{"esfd", "stop-all", "--state", state}); err != nil {
		t.Fatalf("stop-all after esfd stopped: %v", err)
	}
}

func waitServing(t *testing.T, c *client.Client) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := c.Status(context.Background()); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("daemon not answering")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
