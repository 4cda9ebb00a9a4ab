package workspacetest

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"testing"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
)

// envQuoted is an environment value that breaks adapters which build
// "export K=V" lines without quoting.
const envQuoted = `it's "quoted" $HOME; echo injected` + "\t`x`"

// testExec: repeated commands on one session keep state; stdout, stderr and
// exit codes are separate and exact; Env from Spec and from sandbox.Spec
// (which wins and lasts one command); WorkDir; stdin; streaming writers;
// output bigger than a pipe buffer.
func (s *suite) testExec(t *testing.T) {
	sess := s.create(t, func(sp *workspace.Spec) {
		sp.Env["WST_SESSION"] = "session value"
		sp.Env["WST_BOTH"] = "session"
		sp.Env["WST_QUOTED"] = envQuoted
	})
	cwd := s.pwd(t, sess)

	t.Run("Streams", func(t *testing.T) {
		res := s.run(t, sess, sandbox.Spec{}, "echo out; echo err >&2; echo out2")
		if string(res.Stdout) != "out\nout2\n" || string(res.Stderr) != "err\n" || res.ExitCode != 0 {
			t.Errorf("Run = stdout %q, stderr %q, exit %d; want %q, %q, 0", res.Stdout, res.Stderr, res.ExitCode, "out\nout2\n", "err\n")
		}
	})

	t.Run("ExitCodes", func(t *testing.T) {
		for _, tc := range []struct {
			cmd  string
			code int
			out  string
		}{
			{"exit 0", 0, ""},
			{"exit 1", 1, ""},
			{"exit 42", 42, ""},
			{"exit 255", 255, ""},
			{"false", 1, ""},
			{"true", 0, ""},
			{"echo before; exit 7; echo after", 7, "before\n"},
			{"false || exit 3", 3, ""},
			{"true && exit 4", 4, ""},
		} {
			res, err := sess.Run(s.ctx(t), sandbox.Spec{}, tc.cmd)
			if err != nil {
				t.Errorf("Run(%q) = %v; a non-zero exit is a Result, not an error", tc.cmd, err)
				continue
			}
			if res.ExitCode != tc.code || string(res.Stdout) != tc.out {
				t.Errorf("Run(%q) = exit %d, stdout %q; want %d, %q", tc.cmd, res.ExitCode, res.Stdout, tc.code, tc.out)
			}
		}
		res := s.run(t, sess, sandbox.Spec{}, "workspacetest-no-such-command --flag")
		if res.ExitCode != 127 || len(res.Stderr) == 0 {
			t.Errorf("unknown command: exit %d, stderr %q; want 127 and a message", res.ExitCode, res.Stderr)
		}
	})

	t.Run("Repeated", func(t *testing.T) {
		var want strings.Builder
		for i := range 10 {
			s.sh(t, sess, fmt.Sprintf("echo run-%d >> runs.log", i))
			fmt.Fprintf(&want, "run-%d\n", i)
		}
		if got := s.sh(t, sess, "cat runs.log"); got != want.String() {
			t.Errorf("ten Runs appending to one file left %q, want %q", got, want.String())
		}
	})

	t.Run("Env", func(t *testing.T) {
		if got := s.sh(t, sess, `echo "$WST_SESSION|$WST_BOTH|$`+EnvKey+`"`); got != "session value|session|1\n" {
			t.Errorf("session env = %q, want %q", got, "session value|session|1\n")
		}
		if got := s.sh(t, sess, `printf '%s\n' "$WST_QUOTED"`); got != envQuoted+"\n" {
			t.Errorf("session env value with quotes and $ = %q, want %q", got, envQuoted+"\n")
		}
		res := s.run(t, sess, sandbox.Spec{Env: map[string]string{"WST_RUN": "run value", "WST_BOTH": "run", "WST_RUN_Q": envQuoted}},
			`echo "$WST_RUN|$WST_BOTH|$WST_SESSION"; printf '%s\n' "$WST_RUN_Q"`)
		if want := "run value|run|session value\n" + envQuoted + "\n"; string(res.Stdout) != want || res.ExitCode != 0 {
			t.Errorf("Run with Spec.Env = %q (exit %d), want %q", res.Stdout, res.ExitCode, want)
		}
		res = s.run(t, sess, sandbox.Spec{}, "env")
		if res.ExitCode != 0 || strings.Contains("\n"+string(res.Stdout), "\nWST_RUN=") {
			t.Errorf("sandbox.Spec.Env outlived its Run: env = %q, exit %d", res.Stdout, res.ExitCode)
		}
		if got := s.sh(t, sess, `echo "$WST_BOTH"`); got != "session\n" {
			t.Errorf("after a Run that overrode it, WST_BOTH = %q, want %q", got, "session\n")
		}
	})

	t.Run("WorkDir", func(t *testing.T) {
		if err := sess.Write(s.ctx(t), "wd/sub/marker.txt", []byte("marker\n")); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ dir, want string }{
			{"", cwd},
			{"wd/sub", path.Join(cwd, "wd/sub")},
			{"./wd/../wd/sub/", path.Join(cwd, "wd/sub")},
			{path.Join(cwd, "wd"), path.Join(cwd, "wd")},
			{"/tmp", "/tmp"},
		} {
			res := s.run(t, sess, sandbox.Spec{WorkDir: tc.dir}, "pwd")
			if string(res.Stdout) != tc.want+"\n" || res.ExitCode != 0 {
				t.Errorf("pwd with WorkDir %q = %q (exit %d), want %q", tc.dir, res.Stdout, res.ExitCode, tc.want)
			}
		}
		res := s.run(t, sess, sandbox.Spec{WorkDir: "wd/sub"}, "cat marker.txt")
		if string(res.Stdout) != "marker\n" {
			t.Errorf("cat of a relative file in WorkDir = %q (exit %d, stderr %q)", res.Stdout, res.ExitCode, res.Stderr)
		}
		// A WorkDir for one Run does not move the session's directory.
		if got := s.pwd(t, sess); got != cwd {
			t.Errorf("pwd after a Run with WorkDir = %q, want %q", got, cwd)
		}
	})

	t.Run("Stdin", func(t *testing.T) {
		const in = "line one\nline two\n"
		res, err := sess.Run(s.ctx(t), sandbox.Spec{Stdin: strings.NewReader(in)}, "cat")
		if errors.Is(err, workspace.ErrUnsupported) {
			t.Skipf("provider cannot feed stdin: %v", err)
		}
		if err != nil {
			t.Fatalf("Run with Stdin: %v", err)
		}
		if string(res.Stdout) != in || res.ExitCode != 0 {
			t.Errorf("cat of Stdin = %q (exit %d), want %q", res.Stdout, res.ExitCode, in)
		}
		// Larger than any pipe buffer, and stdin must reach EOF for wc to
		// answer at all.
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<14)
		res = s.run(t, sess, sandbox.Spec{Stdin: bytes.NewReader(big)}, "wc -c")
		if n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout))); n != len(big) {
			t.Errorf("wc -c of %d bytes of Stdin = %q", len(big), res.Stdout)
		}
		res = s.run(t, sess, sandbox.Spec{Stdin: strings.NewReader("")}, "wc -c")
		if strings.TrimSpace(string(res.Stdout)) != "0" {
			t.Errorf("wc -c of an empty Stdin = %q", res.Stdout)
		}
	})

	t.Run("StreamingWriters", func(t *testing.T) {
		out, errw := newSyncBuffer(""), newSyncBuffer("")
		res := s.run(t, sess, sandbox.Spec{Stdout: out, Stderr: errw}, "echo a; echo b >&2; echo c; exit 3")
		if out.String() != "a\nc\n" || errw.String() != "b\n" {
			t.Errorf("streamed stdout %q, stderr %q; want %q, %q", out.String(), errw.String(), "a\nc\n", "b\n")
		}
		if len(res.Stdout) != 0 || len(res.Stderr) != 0 || res.ExitCode != 3 {
			t.Errorf("with writers set, Result = stdout %q, stderr %q, exit %d; want empty, empty, 3", res.Stdout, res.Stderr, res.ExitCode)
		}
		// One writer set, the other collected.
		res = s.run(t, sess, sandbox.Spec{Stderr: errw}, "echo kept; echo streamed >&2")
		if string(res.Stdout) != "kept\n" || len(res.Stderr) != 0 || !strings.HasSuffix(errw.String(), "streamed\n") {
			t.Errorf("Stderr writer only: Result stdout %q stderr %q, writer %q", res.Stdout, res.Stderr, errw.String())
		}
	})

	t.Run("LargeOutput", func(t *testing.T) {
		var b bytes.Buffer
		for i := 0; b.Len() < 1<<20; i++ {
			fmt.Fprintf(&b, "line %07d of a large output\n", i)
		}
		if err := sess.Write(s.ctx(t), "large-output.txt", b.Bytes()); err != nil {
			t.Fatal(err)
		}
		res := s.run(t, sess, sandbox.Spec{}, "cat large-output.txt")
		if !bytes.Equal(res.Stdout, b.Bytes()) || res.ExitCode != 0 {
			t.Errorf("cat of a %d-byte file returned %d bytes (exit %d)", b.Len(), len(res.Stdout), res.ExitCode)
		}
	})
}
