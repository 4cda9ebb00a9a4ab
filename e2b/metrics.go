package e2b

import (
	"net/http"
	"time"

	"golang.org/x/sys/unix"
)

// sandboxMetric is E2B's SandboxMetric.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metrics answers one sample, read now from the container's cgroup: CPU
// use is the average since the previous sample (since the start, for the
// first), memory what the cgroup holds against its limit, disk the file
// system that holds the sandbox's writable layer. E2B keeps a history;
// esf samples on demand, so start and end are ignored.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) (int, any, error) {
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	s.mu.Lock()
	a, paused, cpus := sb.attempt, sb.paused != "", sb.cpus
	s.mu.Unlock()
	if paused {
		return http.StatusOK, []sandboxMetric{}, nil
	}
	u, err := s.f.Usage(r.Context(), a.AttemptID)
	if err != nil {
		return 0, nil, err
	}
	now := time.Now()
	m := sandboxMetric{Timestamp: now.UTC(), TimestampUnix: now.Unix(), CPUCount: cpus, MemUsed: u.MemoryBytes,
		MemTotal: u.MemoryLimit}
	s.mu.Lock()
	prevCPU, prevAt := sb.cpuNanos, sb.cpuAt
	if prevAt.IsZero() {
		prevAt = sb.startedAt
	}
	sb.cpuNanos, sb.cpuAt = u.CPUNanos, now
	s.mu.Unlock()
	if wall := now.Sub(prevAt); wall > 0 && u.CPUNanos >= prevCPU && cpus > 0 {
		m.CPUUsedPct = float64(u.CPUNanos-prevCPU) / float64(wall.Nanoseconds()) / float64(cpus) * 100
	}
	var st unix.Statfs_t
	if a.Root != "" && unix.Statfs(a.Root, &st) == nil {
		m.DiskTotal = int64(st.Blocks) * st.Bsize
		m.DiskUsed = int64(st.Blocks-st.Bfree) * st.Bsize
	}
	return http.StatusOK, []sandboxMetric{m}, nil
}
