package initproto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
)

// Fd is where the init finds the listening socket.
const Fd = 3

// Trampoline is the argv[0] that makes the init binary start a command
// instead of being an init; the command is argv[1:].
const Trampoline = "esf-exec"

// Spare is the argv[0] of a trampoline started ahead of its command (a
// Request with Spare set): it reads the command, as a Request with the
// process's stdin, stdout and stderr, from its handshake instead of a go
// byte.
const Spare = "esf-spare"

// SpareDirDenied starts a spare's error text when the working directory
// exists but may not be entered (Started.DirDenied for a spare).
const SpareDirDenied = "workdir denied: "

// HandshakeFd is the trampoline's end of the handshake.
const HandshakeFd = 3

// MaxFrame bounds a frame: arguments and environment of one exec.
const MaxFrame = 8 << 20

// Request asks the init to start a process. Env is the whole environment
// and Dir the working directory, both already resolved by the executor.
type Request struct {
	Args []string `json:"args"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	// Spare asks for a trampoline without a command yet (Args empty):
	// the executor puts it where the exec will live (its cgroup) ahead
	// of time and hands it the command later.
	Spare bool `json:"spare,omitempty"`
}

// Started answers a Request: Pid in the container's pid namespace, or Err
// when no process could be forked (a missing working directory, the pids
// limit).
type Started struct {
	Pid int    `json:"pid,omitempty"`
	Err string `json:"err,omitempty"`
	// DirDenied: the working directory exists but the init's user may
	// not enter it. runc exec enters it before it drops privileges, so
	// the executor asks runc.
	DirDenied bool `json:"dir_denied,omitempty"`
}

// Exited reports the end of a started process: its exit status, or 128+N
// for signal N.
type Exited struct {
	Status int `json:"status"`
}

// Write sends v as one frame, with fds attached.
func Write(c *net.UnixConn, v any, fds ...int) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(body) > MaxFrame {
		return fmt.Errorf("frame of %d bytes: over %d", len(body), MaxFrame)
	}
	frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body)))
	frame = append(frame, body...)
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	// A stream socket may take part of a large frame; the rights went
	// with the first bytes, the rest follows plainly.
	n, _, err := c.WriteMsgUnix(frame, oob, nil)
	if err != nil || n == len(frame) {
		return err
	}
	_, err = c.Write(frame[n:])
	return err
}

// Read receives one frame into v and returns the fds that came with it;
// the caller owns them (they are close-on-exec).
func Read(c *net.UnixConn, v any) (fds []int, err error) {
	defer func() {
		if err != nil {
			for _, fd := range fds {
				syscall.Close(fd)
			}
			fds = nil
		}
	}()
	// The header is read by recvmsg alone, never more: the next frame
	// may already be queued behind this one.
	var hdr [4]byte
	oob := make([]byte, syscall.CmsgSpace(8*4))
	for got := 0; got < len(hdr); {
		n, oobn, _, _, err := c.ReadMsgUnix(hdr[got:], oob)
		if oobn > 0 {
			more, perr := parseRights(oob[:oobn])
			fds = append(fds, more...)
			if perr != nil {
				return fds, perr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && got > 0 {
				err = io.ErrUnexpectedEOF
			}
			return fds, err
		}
		if n == 0 {
			return fds, io.EOF
		}
		got += n
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > MaxFrame {
		return fds, fmt.Errorf("frame of %d bytes: over %d", size, MaxFrame)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fds, err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fds, fmt.Errorf("frame: %w", err)
	}
	return fds, nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		r, err := syscall.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		fds = append(fds, r...)
	}
	return fds, nil
}
