package daytona

import (
	"bytes"
	"flag"
	"io/fs"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"time"
)

var seedFlag = flag.Uint64("seed", 0, "seed for randomised tests (0: time-based)")

func testSeed(t *testing.T) uint64 {
	s := *seedFlag
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -seed=%d)", s, s)
	return s
}

// daemonLog builds the labelled log the daemon writes for a command whose
// streams carry out[1] and out[2], each followed by the adapter's end mark:
// every line gets its stream's label and a final "\n", and the two
// labellers' lines interleave in any order.
func daemonLog(rng *rand.Rand, out [3][]byte) []byte {
	var recs [3][][]byte
	for st := 1; st <= 2; st++ {
		data := append(append([]byte{}, out[st]...), endMark)
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			line := data
			if i >= 0 {
				line, data = data[:i], data[i+1:]
			} else {
				data = nil
			}
			rec := append(append(append([]byte{}, streamLabel[st]...), line...), '\n')
			recs[st] = append(recs[st], rec)
		}
	}
	var log []byte
	for len(recs[1])+len(recs[2]) > 0 {
		st := 1 + rng.IntN(2)
		if len(recs[st]) == 0 {
			st = 3 - st
		}
		log = append(log, recs[st][0]...)
		recs[st] = recs[st][1:]
	}
	return log
}

func randomOutput(rng *rand.Rand) []byte {
	const alphabet = "ab \t\r\n\n\n\x1e\x1e\x7f\xc3\xa9%\\'"
	b := make([]byte, rng.IntN(200))
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return b
}

// TestLogDemuxAnyChunking: however the growing log is cut between polls,
// the streams come out byte for byte, end marks removed.
func TestLogDemuxAnyChunking(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 1))
	for iter := range 2000 {
		want := [3][]byte{nil, randomOutput(rng), randomOutput(rng)}
		if iter%7 == 0 {
			want[1] = nil
		}
		log := daemonLog(rng, want)
		var got [3]bytes.Buffer
		outs := [3]*streamOut{nil, {w: &got[1]}, {w: &got[2]}}
		var dm logDemux
		emit := func(st int, b []byte) error { return outs[st].write(b) }
		for end := 0; end < len(log); {
			end = min(len(log), end+1+rng.IntN(8))
			if _, err := dm.feed(log[:end], false, emit); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := dm.feed(log, true, emit); err != nil {
			t.Fatal(err)
		}
		for st := 1; st <= 2; st++ {
			if err := outs[st].finish(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[st].Bytes(), want[st]) {
				t.Fatalf("iteration %d stream %d: got %q, want %q (log %q)", iter, st, got[st].Bytes(), want[st], log)
			}
		}
	}
}

// TestLogDemuxHoldsPartialLabels: a poll that ends inside a label must not
// emit the label's first bytes as output.
func TestLogDemuxHoldsPartialLabels(t *testing.T) {
	var got bytes.Buffer
	var dm logDemux
	emit := func(st int, b []byte) error { got.Write(b); return nil }
	log := []byte("\x01\x01\x01ab\n\x02\x02\x02cd\n")
	for _, cut := range []int{6, 7, 8} {
		got.Reset()
		dm = logDemux{}
		dm.feed(log[:cut], false, emit)
		if strings.ContainsAny(got.String(), "\x02") {
			t.Errorf("cut at %d emitted %q", cut, got.String())
		}
		dm.feed(log, true, emit)
		if got.String() != "ab\ncd\n" {
			t.Errorf("cut at %d: %q", cut, got.String())
		}
	}
}

func shells(t *testing.T) []string {
	var out []string
	for _, sh := range []string{"sh", "dash", "bash", "busybox"} {
		if p, err := exec.LookPath(sh); err == nil {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		t.Skip("no shell")
	}
	return out
}

func shCommand(sh string, args ...string) *exec.Cmd {
	if strings.HasSuffix(sh, "busybox") {
		return exec.Command(sh, append([]string{"sh"}, args...)...)
	}
	return exec.Command(sh, args...)
}

// TestPrintfQuoteRoundTrip: every byte value survives printf in every
// shell at hand.
func TestPrintfQuoteRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 2))
	data := make([]byte, 0, 4096)
	for c := range 256 {
		data = append(data, byte(c))
	}
	for range 2048 {
		data = append(data, byte(rng.IntN(256)))
	}
	for _, sh := range shells(t) {
		out, err := shCommand(sh, "-c", "printf "+printfQuote(data)).Output()
		if err != nil || !bytes.Equal(out, data) {
			t.Errorf("%s: printf round trip gave %d bytes (%v), want %d", sh, len(out), err, len(data))
		}
	}
}

// TestScriptRunsLikeShC: the generated script, run by the shells a
// Daytona image may use for its sessions, behaves like `sh -c command`
// with the environment, directory and stdin asked for, and ends each
// stream with the end mark.
func TestScriptRunsLikeShC(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		env     map[string]string
		stdin   *string
		cmd     string
		out     string
		err     string
		exit    int
		noShell bool
	}{
		{name: "status", cmd: "echo a; echo b >&2; exit 3", out: "a\n", err: "b\n", exit: 3},
		{name: "directory", cmd: "pwd", out: dir + "\n"},
		{name: "env", env: map[string]string{"Q": `it's "q" $HOME ` + "`x`", "P": "p"}, cmd: `printf '%s|%s' "$Q" "$P"`, out: `it's "q" $HOME ` + "`x`|p"},
		{name: "stdin", stdin: ptr("one\ntwo"), cmd: "cat; echo", out: "one\ntwo\n"},
		{name: "empty stdin", stdin: ptr(""), cmd: "wc -c", out: "0\n"},
		{name: "no stdin", cmd: "cat", out: ""},
		{name: "own pid and $0", cmd: `[ "$$" != "$PPID" ] && echo "$0"`, out: "sh\n"},
		{name: "exit does not end the caller", cmd: "exit 0; echo no", out: ""},
		{name: "signal (the parent shell reports it)", cmd: "kill -TERM $$", err: "Terminated\n", exit: 143},
		{name: "heredoc delimiter-like text", cmd: "echo ESF_CMD_\necho 'EOF'", out: "ESF_CMD_\nEOF\n"},
	} {
		var in []byte
		if tc.stdin != nil {
			in = []byte(*tc.stdin)
		}
		script, err := buildScript(dir, tc.env, in, tc.stdin != nil, tc.cmd)
		if err != nil {
			t.Fatal(err)
		}
		for _, sh := range shells(t) {
			var stdout, stderr bytes.Buffer
			c := shCommand(sh, "-c", script)
			c.Stdin = strings.NewReader("the session shell's own stdin must not reach the command")
			c.Stdout, c.Stderr = &stdout, &stderr
			err := c.Run()
			exit := 0
			if ee, ok := err.(*exec.ExitError); ok {
				exit = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			wantOut, wantErr := tc.out+"\x1e", tc.err+"\x1e"
			if stdout.String() != wantOut || stderr.String() != wantErr || exit != tc.exit {
				t.Errorf("%s (%s): stdout %q stderr %q exit %d; want %q %q %d", tc.name, sh, stdout.String(), stderr.String(), exit, wantOut, wantErr, tc.exit)
			}
		}
	}
	for _, bad := range []map[string]string{{"": "x"}, {"A=B": "x"}, {"-i": "x"}, {"A": "x\x00"}} {
		if _, err := buildScript(dir, bad, nil, false, "true"); err == nil {
			t.Errorf("buildScript accepted env %q", bad)
		}
	}
}

func ptr(s string) *string { return &s }

// TestFileModeFromDaemon: the daemon sends Go's FileMode.String(); it reads
// back to the same mode, and the octal permissions are the fallback.
func TestFileModeFromDaemon(t *testing.T) {
	for _, m := range []fs.FileMode{
		0o644, 0o600, fs.ModeDir | 0o755, fs.ModeDir | fs.ModeSticky | 0o777, fs.ModeSymlink | 0o777,
		fs.ModeSetuid | 0o755, fs.ModeNamedPipe | 0o600, fs.ModeSocket | 0o700,
		fs.ModeDevice | fs.ModeCharDevice | 0o666, 0,
	} {
		fi := fileInfo{Mode: m.String(), IsDir: m.IsDir()}
		if got := fi.mode(); got != m {
			t.Errorf("mode(%q) = %v, want %v", m.String(), got, m)
		}
	}
	for _, tc := range []struct {
		fi   fileInfo
		want fs.FileMode
	}{
		{fileInfo{Mode: "garbage", Permissions: "0640"}, 0o640},
		{fileInfo{Permissions: "0755", IsDir: true}, fs.ModeDir | 0o755},
		{fileInfo{Mode: "-rw-r--r--", IsDir: true, Permissions: "0755"}, fs.ModeDir | 0o755},
	} {
		if got := tc.fi.mode(); got != tc.want {
			t.Errorf("mode(%+v) = %v, want %v", tc.fi, got, tc.want)
		}
	}
}
