package fake_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
	"github.com/esf-dev/esf/workspace/fake"
)

func newSession(t *testing.T, opts fake.Options, spec workspace.Spec) (*fake.Provider, workspace.Session) {
	t.Helper()
	p, err := fake.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return p, s
}

// TestShell pins what the fake shell understands, so the conformance suite's
// commands mean here what they mean in sh, and what it refuses.
func TestShell(t *testing.T) {
	ctx := context.Background()
	_, s := newSession(t, fake.Options{}, workspace.Spec{Env: map[string]string{"SESS": "s v", "EMPTY": ""}})
	if err := s.Write(ctx, "~/f.txt", []byte("one\ntwo words\n")); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, "/tmp/sub/g", []byte("g")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cmd          string
		stdin        string
		env          map[string]string
		out, errOut  string
		exit         int
		checkErrText bool // compare stderr exactly (else: contains)
	}{
		{cmd: "echo hello world", out: "hello world\n"},
		{cmd: "echo -n a; echo b", out: "ab\n"},
		{cmd: `echo 'single $SESS' "double $SESS" \$SESS`, out: "single $SESS double s v $SESS\n"},
		{cmd: `echo "${SESS}x" $SESS`, out: "s vx s v\n"},
		{cmd: `echo "a\"b\\c\d"`, out: `a"b\c\d` + "\n"},
		{cmd: `echo 'it'\''s'`, out: "it's\n"},
		{cmd: `echo "" x`, out: " x\n"},
		{cmd: `echo $NOPE. $EMPTY.`, out: ". .\n"},
		{cmd: "echo a # comment\necho b", out: "a\nb\n"},
		{cmd: "echo ~ ~/x a~", out: "/home/user /home/user/x a~\n"},
		{cmd: "echo err >&2; echo out", out: "out\n", errOut: "err\n", checkErrText: true},
		{cmd: "echo err 1>&2", errOut: "err\n", checkErrText: true},
		{cmd: "cat nope 2>&1", out: "cat: nope: No such file or directory\n", exit: 1},
		{cmd: "pwd", out: "/home/user\n"},
		{cmd: "cd /tmp/sub && pwd && cat g", out: "/tmp/sub\ng"},
		{cmd: "cd; pwd", out: "/home/user\n"},
		{cmd: `cd /tmp && echo "$PWD"; echo $?`, out: "/tmp\n0\n"},
		{cmd: "cd /nope", errOut: "can't cd", exit: 2},
		{cmd: "exit 3", exit: 3},
		{cmd: "exit 256", exit: 0},
		{cmd: "echo a; exit 4; echo b", out: "a\n", exit: 4},
		{cmd: "false; exit", exit: 1},
		{cmd: "true && echo y || echo n", out: "y\n"},
		{cmd: "false && echo y || echo n", out: "n\n"},
		{cmd: "false && echo y; echo z", out: "z\n"},
		{cmd: "false; echo $?", out: "1\n"},
		{cmd: "nosuchcmd arg", errOut: "nosuchcmd: not found", exit: 127},
		{cmd: "printf '%s-%d|' a 1 b 2", out: "a-1|b-2|"},
		{cmd: `printf 'x\ty\n\101%%\n'`, out: "x\ty\n\\101%\n"},
		{cmd: `printf '\0101\n'`, out: "A\n"},
		{cmd: "printf %5s x", errOut: "unsupported", exit: 1},
		{cmd: "cat", stdin: "from stdin\n", out: "from stdin\n"},
		{cmd: "cat - f.txt", stdin: "in\n", out: "in\none\ntwo words\n"},
		{cmd: "cat < f.txt", out: "one\ntwo words\n"},
		{cmd: "wc -c", stdin: "12345", out: "5\n"},
		{cmd: "wc -l f.txt", out: "2 f.txt\n"},
		{cmd: "wc f.txt", out: "2 3 14 f.txt\n"},
		{cmd: "wc -lc < f.txt", out: "2 14\n"},
		{cmd: "printenv SESS", out: "s v\n"},
		{cmd: "printenv NOPE", exit: 1},
		{cmd: "printenv RUN SESS", env: map[string]string{"RUN": "r", "SESS": "over"}, out: "r\nover\n"},
		{cmd: "env", env: map[string]string{"RUN": "r"}, out: "EMPTY=\nHOME=/home/user\nPATH=/usr/local/bin:/usr/bin:/bin\nPWD=/home/user\nRUN=r\nSESS=s v\nUSER=user\n"},
		{cmd: "echo x > new.txt; cat new.txt; echo y >> new.txt; cat new.txt", out: "x\nx\ny\n"},
		{cmd: "echo x > /nodir/f", errOut: "Directory nonexistent", exit: 2},
		{cmd: "echo x > /tmp", errOut: "Is a directory", exit: 2},
		{cmd: "cat nope 2> /tmp/err.txt; cat /tmp/err.txt", out: "cat: nope: No such file or directory\n"},
		{cmd: "sleep 0.01 && echo slept", out: "slept\n"},
		{cmd: "sleep x", errOut: "invalid time", exit: 1},
		{cmd: "chmod 700 f.txt", exit: 0},
		{cmd: "chmod u+x f.txt", errOut: "invalid mode", exit: 1},
		{cmd: "echo a | cat", errOut: "unsupported", exit: 2},
		{cmd: "sleep 1 &", errOut: "unsupported", exit: 2},
		{cmd: "echo $(pwd)", errOut: "unsupported", exit: 2},
		{cmd: "echo `pwd`", errOut: "unsupported", exit: 2},
		{cmd: "(echo a)", errOut: "unsupported", exit: 2},
		{cmd: "echo 'open", errOut: "unterminated", exit: 2},
		{cmd: "&& echo a", errOut: "syntax error", exit: 2},
		{cmd: "echo a &&", errOut: "syntax error", exit: 2},
		{cmd: "echo >", errOut: "syntax error", exit: 2},
		{cmd: "", exit: 0},
	} {
		spec := sandbox.Spec{Env: tc.env}
		if tc.stdin != "" {
			spec.Stdin = strings.NewReader(tc.stdin)
		}
		res, err := s.Run(ctx, spec, tc.cmd)
		if err != nil {
			t.Errorf("Run(%q): %v", tc.cmd, err)
			continue
		}
		errOK := string(res.Stderr) == tc.errOut
		if !tc.checkErrText {
			errOK = tc.errOut == "" && len(res.Stderr) == 0 || tc.errOut != "" && strings.Contains(string(res.Stderr), tc.errOut)
		}
		if string(res.Stdout) != tc.out || !errOK || res.ExitCode != tc.exit {
			t.Errorf("Run(%q) = stdout %q, stderr %q, exit %d; want %q, %q, %d", tc.cmd, res.Stdout, res.Stderr, res.ExitCode, tc.out, tc.errOut, tc.exit)
		}
	}
	fi, err := s.List(ctx, "f.txt")
	if err != nil || len(fi) != 1 || fi[0].Mode.Perm() != 0o700 {
		t.Errorf("after chmod 700: List = %+v, %v", fi, err)
	}
}

// TestShellSleepHonoursContext: sleep ends when Run's ctx or Timeout does,
// and Run reports it as the context's error, not as a Result.
func TestShellSleepHonoursContext(t *testing.T) {
	_, s := newSession(t, fake.Options{}, workspace.Spec{})
	start := time.Now()
	_, err := s.Run(context.Background(), sandbox.Spec{Timeout: 50 * time.Millisecond}, "sleep 30")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Errorf("sleep with Timeout: %v after %v", err, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = s.Run(ctx, sandbox.Spec{}, "sleep 30; echo never")
	if !errors.Is(err, context.Canceled) {
		t.Errorf("sleep with cancel: %v", err)
	}
	// A stdin that blocks until ctx ends is not read past it.
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { <-ctx.Done(); pw.CloseWithError(ctx.Err()) }()
	if _, err = s.Run(ctx, sandbox.Spec{Stdin: pr}, "cat"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cat of a stalled stdin: %v", err)
	}
}
