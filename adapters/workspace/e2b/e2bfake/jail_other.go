//go:build !linux

package e2bfake

import (
	"errors"
	"os/exec"
)

// Jails need Linux mount namespaces; elsewhere the fake maps the cwd only.

type jail struct{}

func jailAvailable() bool { return false }

// JailAvailable reports whether commands can run in jails: never here.
func JailAvailable() bool { return false }

func startJail(string) (*jail, error) { return nil, errors.ErrUnsupported }

func (*jail) command(cwd, cmd string, args []string) *exec.Cmd { return exec.Command(cmd, args...) }

func (*jail) close() {}
