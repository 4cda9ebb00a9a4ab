package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
)

// killTree SIGKILLs an exec's process (pid, a session leader: runc calls
// setsid), every process of its session and every descendant of any of
// them, as long as they are still in the container's cgroup. It repeats
// until none is left alive, since a process may fork between the listing
// and the kill; killing is final, so a process never escapes by forking
// faster than one pass.
//
// Pids come from the cgroup and are signalled through a pidfd opened after
// the decision and checked against the start time read with it, so a pid
// recycled in between is never hit.
func (e *Executor) killTree(id string, pid int) {
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.CommandTimeout)
	defer cancel()
	const settle = 5 * time.Second
	deadline := time.Now().Add(settle)
	tree := map[int]bool{pid: true}
	rid := e.runcID(id)
	for pass := 0; ; pass++ {
		pids, err := e.rc.Ps(ctx, rid)
		if err != nil {
			return // the container is gone, and its processes with it
		}
		procs := make(map[int]procStat, len(pids))
		for _, q := range pids {
			if st, err := readStat(q); err == nil {
				procs[q] = st
			}
		}
		vs := victims(procs, pid, tree)
		if len(vs) == 0 {
			return
		}
		if pass == 1 {
			// Still alive after a SIGKILL: a frozen container holds them
			// until Thaw or Stop, which will finish the job.
			if info, err := e.state(ctx, id); err == nil && info.Status == executor.StatusPaused {
				return
			}
		}
		for _, v := range vs {
			tree[v.pid] = true
			pidfdKill(v)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// victims are the live processes of procs that belong to the exec: in
// pid's session, or below any process of the tree.
func victims(procs map[int]procStat, pid int, tree map[int]bool) []procStat {
	var out []procStat
	for _, st := range procs {
		if st.state == 'Z' || st.state == 'X' {
			continue
		}
		in := st.sid == pid
		// Walk up the parents known in the cgroup; depth is bounded by
		// the pids limit, the visited bound by len(procs).
		for q, n := st.pid, 0; !in && n <= len(procs); n++ {
			if tree[q] {
				in = true
				break
			}
			parent, ok := procs[q]
			if !ok {
				break
			}
			q = parent.ppid
		}
		if in {
			out = append(out, st)
		}
	}
	return out
}

func pidfdKill(v procStat) bool {
	fd, err := unix.PidfdOpen(v.pid, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if now, err := readStat(v.pid); err != nil || now.start != v.start {
		return false // gone, or the pid now names another process
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil
}

// procStat is what killTree needs of /proc/<pid>/stat.
type procStat struct {
	pid, ppid, sid int
	state          byte
	start          uint64 // clock ticks after boot: with pid, an identity
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseStat(pid, b)
}

// parseStat reads proc(5)'s stat line. The command name may hold spaces
// and parentheses, so fields are counted from its last ')'.
func parseStat(pid int, b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return procStat{}, errors.New("malformed stat")
	}
	f := bytes.Fields(b[i+1:])
	// f[0] state, f[1] ppid, f[2] pgrp, f[3] session, ..., f[19] starttime
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("stat of %d: %d fields", pid, len(f))
	}
	st := procStat{pid: pid, state: f[0][0]}
	var err1, err2, err3 error
	st.ppid, err1 = strconv.Atoi(string(f[1]))
	st.sid, err2 = strconv.Atoi(string(f[3]))
	st.start, err3 = strconv.ParseUint(string(f[19]), 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return procStat{}, fmt.Errorf("stat of %d: %w", pid, err)
	}
	return st, nil
}
