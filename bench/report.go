package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/internal/atomicfile"
)

// Machine describes where a run happened: ratios travel between machines,
// absolute numbers do not.
type Machine struct {
	Date        string `json:"date"`
	Mode        string `json:"mode"` // quick or full
	Kernel      string `json:"kernel"`
	CPUModel    string `json:"cpu_model"`
	CPUs        int    `json:"cpu_count"`
	MemTotalMiB int64  `json:"mem_total_mib"`
	GoVersion   string `json:"go_version"`
	Commit      string `json:"commit,omitempty"`
	// StateDir is the run's root; StateFS its file system type and mount
	// options (every path of the run, native baselines included, is there).
	StateDir   string `json:"state_dir"`
	StateFS    string `json:"state_fs"`
	StateFSOpt string `json:"state_fs_options"`
	// DropCaches says whether cold rows dropped the page cache first
	// (echo 3 > /proc/sys/vm/drop_caches, as root).
	DropCaches bool `json:"drop_caches"`
	// LoadStart and LoadEnd are /proc/loadavg: the machine is shared.
	LoadStart string `json:"loadavg_start"`
	LoadEnd   string `json:"loadavg_end"`
}

func probeMachine(root string, quick bool) Machine {
	m := Machine{
		Date: time.Now().UTC().Format(time.RFC3339), Mode: "full",
		CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), StateDir: root,
		DropCaches: canDropCaches(), LoadStart: loadavg(),
	}
	if quick {
		m.Mode = "quick"
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemTotalMiB = int64(si.Totalram) * int64(si.Unit) >> 20
	}
	m.StateFS, m.StateFSOpt = fsOf(root)
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
	}
	return m
}

// fsOf returns the type and options of the file system holding dir (the
// mount with the longest mount point that is a prefix of dir).
func fsOf(dir string) (fstype, opts string) {
	infos, err := mountinfo.GetMounts(mountinfo.ParentsFilter(dir))
	if err != nil {
		return "", ""
	}
	best := -1
	for _, in := range infos {
		if len(in.Mountpoint) > best {
			best = len(in.Mountpoint)
			fstype, opts = in.FSType, in.Options
			if in.VFSOptions != "" {
				opts += "," + in.VFSOptions
			}
		}
	}
	return fstype, opts
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return ""
}

func canDropCaches() bool {
	f, err := os.OpenFile("/proc/sys/vm/drop_caches", os.O_WRONLY, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// Table renders the rows as an aligned text table.
func (r *Results) Table() string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "name\tvalue\tunit\tp90\tbaseline\tbaseline value\tratio\ttarget\tverdict\tpath")
	for _, row := range r.Rows {
		c := cells(row)
		fmt.Fprintln(w, strings.Join(c[:10], "\t"))
	}
	w.Flush()
	if notes := notesOf(r.Rows); notes != "" {
		b.WriteString("\n" + notes)
	}
	return b.String()
}

// Markdown renders the machine line and the rows as a Markdown table (the
// README's Benchmarks section).
func (r *Results) Markdown() string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "%s mode, %s; %s, %d CPUs, %d MiB RAM, kernel %s, state on %s (%s); load %s → %s\n\n",
		m.Mode, m.Date, m.CPUModel, m.CPUs, m.MemTotalMiB, m.Kernel, m.StateFS, m.StateDir, m.LoadStart, m.LoadEnd)
	b.WriteString("| name | value | unit | p90 | baseline | baseline value | ratio | target | verdict | path |\n")
	b.WriteString("|---|---:|---|---:|---|---:|---:|---|---|---|\n")
	for _, row := range r.Rows {
		c := cells(row)
		for i := range c {
			c[i] = strings.ReplaceAll(c[i], "|", `\|`)
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(c[:10], " | "))
	}
	if notes := notesOf(r.Rows); notes != "" {
		b.WriteString("\n" + notes)
	}
	return b.String()
}

func cells(r Row) []string {
	c := make([]string, 10)
	c[0] = r.Name
	if r.Verdict != VerdictTODO && r.Verdict != VerdictSkip && r.Verdict != VerdictError {
		c[1] = trimFloat(r.Value)
		c[2] = r.Unit
		if r.P90 != 0 {
			c[3] = trimFloat(r.P90)
		}
	}
	c[4] = r.Baseline
	if r.Baseline != "" {
		c[5] = trimFloat(r.BaselineValue)
		if r.Ratio != 0 {
			c[6] = trimFloat(r.Ratio)
		}
	}
	var ts []string
	for _, t := range r.Targets {
		ts = append(ts, t.Format(r.Unit))
	}
	c[7] = strings.Join(ts, "; ")
	c[8] = r.Verdict
	c[9] = r.Path
	return c
}

// notesOf lists the rows' notes as numbered footnotes.
func notesOf(rows []Row) string {
	var b strings.Builder
	for _, r := range rows {
		if r.Note != "" {
			fmt.Fprintf(&b, "- %s: %s\n", r.Name, r.Note)
		}
	}
	return b.String()
}

// WriteJSON writes r to path (indented, atomically).
func (r *Results) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, append(b, '\n'), 0o644)
}
