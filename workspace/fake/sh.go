package fake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/esf-dev/esf/vfs"
)

// The fake shell. It is deliberately tiny: enough for the conformance suite
// and for product tests that drive a session with simple commands, and
// honest about the rest (exit 127 "not found" for unknown commands, exit 2
// "unsupported" for syntax it does not implement) so a test never passes
// by accident on a command the fake only pretends to run.
//
// Syntax: words separated by blanks; 'single' and "double" quotes;
// backslash escapes; $NAME, ${NAME}, $? and $$ expansion (no field
// splitting, no globbing); a leading ~ or ~/ is $HOME; # comments; lists
// joined by ";", newline, "&&" and "||"; redirections >f >>f <f 2>f 2>>f
// >&2 1>&2 2>&1. Not supported: pipes, background jobs, subshells, command
// substitution, variable assignment, functions, control flow.
//
// Commands: echo [-n], printf FORMAT [ARG...] (%s %d %i %c %%, \n \t \r \\
// \a \b \f \v \0NNN), cat [FILE|-...], pwd, cd [DIR], exit [N], sleep
// SECONDS (decimal, suffix s/m/h; stops when ctx ends), env, printenv
// [NAME...], wc [-c|-l|-w...] [FILE...], chmod OCTAL FILE..., true, false.

// shell runs one command line.
type shell struct {
	ctx   context.Context
	tree  *tree
	now   func() time.Time
	home  string
	cwd   string
	env   map[string]string
	stdin io.Reader // Spec.Stdin; nil reads as empty
	pid   int

	status int
}

// run executes line and returns its exit status.
func (sh *shell) run(line string, stdout, stderr io.Writer) int {
	toks, err := sh.lex(line)
	if err != nil {
		fmt.Fprintf(stderr, "sh: %v\n", err)
		return 2
	}
	steps, err := parse(toks)
	if err != nil {
		fmt.Fprintf(stderr, "sh: %v\n", err)
		return 2
	}
	for _, st := range steps {
		if sh.ctx.Err() != nil {
			return sh.status
		}
		switch {
		case st.conn == "&&" && sh.status != 0:
			continue
		case st.conn == "||" && sh.status == 0:
			continue
		}
		exit, code := sh.exec(st.cmd, stdout, stderr)
		sh.status = code
		if exit {
			return code
		}
	}
	return sh.status
}

// token is a word or an operator.
type token struct {
	op    string // "" for a word; ";", "&&", "||", or a redirection
	word  word
	fd    int // redirections: the fd redirected
	dupTo int // ">&": the fd duplicated
}

// word is a shell word as parts, so parameters are expanded when its
// command runs ("false; echo $?" sees the status of false).
type word []part

// part is literal text or, when param is set, a parameter to expand.
type part struct {
	lit   string
	param string
}

func (w word) expand(sh *shell) string {
	var b strings.Builder
	for _, p := range w {
		switch p.param {
		case "":
			b.WriteString(p.lit)
		case "?":
			b.WriteString(strconv.Itoa(sh.status))
		case "$":
			b.WriteString(strconv.Itoa(sh.pid))
		default:
			b.WriteString(sh.env[p.param])
		}
	}
	return b.String()
}

// errUnsupported marks syntax the fake shell does not implement.
var errUnsupported = errors.New("unsupported by the fake shell")

func (sh *shell) lex(s string) ([]token, error) {
	var toks []token
	var cur word
	inWord := false // a word has started, possibly empty ("")
	digitsOnly := true
	quoted := false
	end := func() {
		if inWord {
			toks = append(toks, token{word: cur})
		}
		cur = nil
		inWord, digitsOnly, quoted = false, true, false
	}
	add := func(str string, q bool) {
		cur = append(cur, part{lit: str})
		inWord = true
		quoted = quoted || q
		for _, r := range str {
			if r < '0' || r > '9' {
				digitsOnly = false
			}
		}
	}
	addParam := func(name string) {
		cur = append(cur, part{param: name})
		inWord, quoted, digitsOnly = true, true, false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			end()
		case c == '\n' || c == ';':
			end()
			if i+1 < len(s) && c == ';' && s[i+1] == ';' {
				return nil, fmt.Errorf(";;: %w", errUnsupported)
			}
			toks = append(toks, token{op: ";"})
		case c == '#' && !inWord:
			for i < len(s) && s[i] != '\n' {
				i++
			}
			i--
		case c == '&' || c == '|':
			end()
			if i+1 < len(s) && s[i+1] == c {
				toks = append(toks, token{op: string([]byte{c, c})})
				i++
				continue
			}
			return nil, fmt.Errorf("%c: %w", c, errUnsupported)
		case c == '>' || c == '<':
			fd := 1
			if c == '<' {
				fd = 0
			}
			if inWord && !quoted && digitsOnly && len(cur) == 1 && len(cur[0].lit) == 1 {
				fd = int(cur[0].lit[0] - '0')
				cur, inWord = nil, false
			}
			end()
			op := string(c)
			if c == '>' && i+1 < len(s) && s[i+1] == '>' {
				op, i = ">>", i+1
			}
			if c == '>' && op == ">" && i+1 < len(s) && s[i+1] == '&' {
				if i+2 >= len(s) || (s[i+2] != '1' && s[i+2] != '2') {
					return nil, fmt.Errorf(">&: only >&1 and >&2: %w", errUnsupported)
				}
				toks = append(toks, token{op: ">&", fd: fd, dupTo: int(s[i+2] - '0')})
				i += 2
				continue
			}
			toks = append(toks, token{op: op, fd: fd})
		case c == '(' || c == ')' || c == '`':
			return nil, fmt.Errorf("%c: %w", c, errUnsupported)
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("syntax error: unterminated quoted string")
			}
			add(s[i+1:i+1+j], true)
			i += j + 1
		case c == '"':
			i++
			add("", true) // "" is a word
			for ; i < len(s) && s[i] != '"'; i++ {
				switch {
				case s[i] == '\\' && i+1 < len(s) && strings.IndexByte("$`\"\\\n", s[i+1]) >= 0:
					if s[i+1] != '\n' {
						add(s[i+1:i+2], true)
					}
					i++
				case s[i] == '$':
					name, n, err := param(s[i:])
					if err != nil {
						return nil, err
					}
					if name == "" {
						add("$", true)
					} else {
						addParam(name)
					}
					i += n - 1
				case s[i] == '`':
					return nil, fmt.Errorf("`: %w", errUnsupported)
				default:
					add(s[i:i+1], true)
				}
			}
			if i >= len(s) {
				return nil, errors.New("syntax error: unterminated quoted string")
			}
		case c == '\\':
			if i+1 < len(s) {
				if s[i+1] != '\n' {
					add(s[i+1:i+2], true)
				}
				i++
			}
		case c == '$':
			name, n, err := param(s[i:])
			if err != nil {
				return nil, err
			}
			if name == "" {
				add("$", false)
			} else {
				addParam(name)
			}
			i += n - 1
		case c == '~' && !inWord && (i+1 == len(s) || strings.IndexByte("/ \t\n;&|<>", s[i+1]) >= 0):
			addParam("HOME")
		default:
			add(s[i:i+1], false)
		}
	}
	end()
	return toks, nil
}

// param reads the parameter at the start of s ("$..."), returning its name
// and how many bytes it used; "" when the "$" is a literal dollar.
func param(s string) (string, int, error) {
	if len(s) < 2 {
		return "", 1, nil
	}
	switch c := s[1]; {
	case c == '?' || c == '$':
		return s[1:2], 2, nil
	case c == '(':
		return "", 0, fmt.Errorf("$(: %w", errUnsupported)
	case c == '{':
		j := strings.IndexByte(s, '}')
		if j < 0 {
			return "", 0, errors.New("syntax error: missing }")
		}
		name := s[2:j]
		if !isName(name) {
			return "", 0, fmt.Errorf("${%s}: %w", name, errUnsupported)
		}
		return name, j + 1, nil
	case c == '_' || unicode.IsLetter(rune(c)) && c < 0x80:
		j := 2
		for j < len(s) && (s[j] == '_' || s[j] < 0x80 && (unicode.IsLetter(rune(s[j])) || unicode.IsDigit(rune(s[j])))) {
			j++
		}
		return s[1:j], j, nil
	case c >= '0' && c <= '9':
		return s[1:2], 2, nil // positional parameters: sh -c has none, so they expand to ""
	}
	return "", 1, nil
}

func isName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, r := range s {
		if r != '_' && !(r < 0x80 && (unicode.IsLetter(r) || unicode.IsDigit(r))) {
			return false
		}
	}
	return true
}

// command is one simple command: its words and redirections in order.
type command struct {
	args   []word
	redirs []token // a redirection token whose word is its target
}

// step is a command and how it joins the previous one ("" or ";", "&&",
// "||").
type step struct {
	conn string
	cmd  command
}

func parse(toks []token) ([]step, error) {
	var steps []step
	cur := step{}
	flush := func(next string) error {
		empty := len(cur.cmd.args) == 0 && len(cur.cmd.redirs) == 0
		if empty && (next == "&&" || next == "||" || cur.conn == "&&" || cur.conn == "||") {
			return fmt.Errorf("syntax error: %q without a command", firstNonEmpty(next, cur.conn))
		}
		if !empty {
			steps = append(steps, cur)
		}
		cur = step{conn: next}
		return nil
	}
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		switch t.op {
		case "":
			cur.cmd.args = append(cur.cmd.args, t.word)
		case ";", "&&", "||":
			if err := flush(t.op); err != nil {
				return nil, err
			}
		case ">&":
			cur.cmd.redirs = append(cur.cmd.redirs, t)
		default: // > >> <
			if i+1 >= len(toks) || toks[i+1].op != "" {
				return nil, fmt.Errorf("syntax error: %s without a file", t.op)
			}
			t.word = toks[i+1].word
			cur.cmd.redirs = append(cur.cmd.redirs, t)
			i++
		}
	}
	if err := flush(""); err != nil {
		return nil, err
	}
	return steps, nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// fileSink buffers a command's output for a "> file" redirection; the file
// is replaced when the command ends (a real shell writes as it goes; the
// difference is invisible to a command that exits).
type fileSink struct {
	path   string
	append bool
	buf    bytes.Buffer
}

func (f *fileSink) Write(p []byte) (int, error) { return f.buf.Write(p) }

// exec runs one command; exit reports "exit" was called.
func (sh *shell) exec(c command, stdout, stderr io.Writer) (exit bool, status int) {
	fds := [3]any{sh.stdinReader(), stdout, stderr}
	var sinks []*fileSink
	for _, r := range c.redirs {
		target := r.word.expand(sh)
		if r.fd > 2 {
			fmt.Fprintf(stderr, "sh: %d%s: %v\n", r.fd, r.op, errUnsupported)
			return false, 2
		}
		switch r.op {
		case ">&":
			if r.fd == 0 {
				fmt.Fprintf(stderr, "sh: 0>&: %v\n", errUnsupported)
				return false, 2
			}
			fds[r.fd] = fds[r.dupTo]
		case ">", ">>":
			abs, err := vfs.Resolve(sh.home, sh.cwd, target)
			if err != nil {
				fmt.Fprintf(stderr, "sh: cannot create %s: %v\n", target, err)
				return false, 2
			}
			if n, ok := sh.tree.get(abs); ok && n.mode.IsDir() {
				fmt.Fprintf(stderr, "sh: cannot create %s: Is a directory\n", target)
				return false, 2
			}
			if n, ok := sh.tree.get(pathDir(abs)); !ok || !n.mode.IsDir() {
				fmt.Fprintf(stderr, "sh: cannot create %s: Directory nonexistent\n", target)
				return false, 2
			}
			f := &fileSink{path: abs, append: r.op == ">>"}
			sinks = append(sinks, f)
			fds[r.fd] = f
		case "<":
			if r.fd != 0 {
				fmt.Fprintf(stderr, "sh: %d<: %v\n", r.fd, errUnsupported)
				return false, 2
			}
			rd, err := sh.open(target)
			if err != nil {
				fmt.Fprintf(stderr, "sh: cannot open %s: %s\n", target, errText(err))
				return false, 2
			}
			fds[0] = rd
		}
	}
	args := make([]string, len(c.args))
	for i, w := range c.args {
		args[i] = w.expand(sh)
	}
	exit, status = sh.builtin(args, fds[0].(io.Reader), fds[1].(io.Writer), fds[2].(io.Writer))
	for _, f := range sinks {
		var data content
		if f.append {
			if n, ok := sh.tree.get(f.path); ok && n.mode.IsRegular() {
				data = n.data
			}
		}
		if f.buf.Len() > 0 {
			data.chunks = append(slices.Clip(data.chunks), slices.Clone(f.buf.Bytes()))
			data.size += int64(f.buf.Len())
		}
		if err := sh.tree.put("write", f.path, data, sh.now(), false); err != nil {
			fmt.Fprintf(stderr, "sh: cannot create %s: %s\n", f.path, errText(err))
			if status == 0 {
				status = 2
			}
		}
	}
	return exit, status
}

func pathDir(p string) string {
	i := strings.LastIndexByte(p, '/')
	if i <= 0 {
		return "/"
	}
	return p[:i]
}

// stdinReader is Spec.Stdin read in the calling goroutine, checking ctx
// before every Read.
func (sh *shell) stdinReader() io.Reader {
	if sh.stdin == nil {
		return strings.NewReader("")
	}
	return ctxReader{sh.ctx, sh.stdin}
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// open opens a file of the session for reading.
func (sh *shell) open(name string) (io.Reader, error) {
	abs, err := vfs.Resolve(sh.home, sh.cwd, name)
	if err != nil {
		return nil, err
	}
	n, err := sh.tree.file("open", abs)
	if err != nil {
		return nil, err
	}
	return &contentReader{ctx: sh.ctx, chunks: n.data.chunks}, nil
}

// errText is the coreutils spelling of a file error.
func errText(err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "No such file or directory"
	case errors.Is(err, fs.ErrInvalid):
		return "Is a directory"
	}
	return err.Error()
}

func (sh *shell) builtin(args []string, in io.Reader, out, errw io.Writer) (exit bool, status int) {
	if len(args) == 0 {
		return false, 0 // redirections alone: "> f" truncates f
	}
	name, args := args[0], args[1:]
	switch name {
	case "true":
		return false, 0
	case "false":
		return false, 1
	case "echo":
		nl := true
		if len(args) > 0 && args[0] == "-n" {
			nl, args = false, args[1:]
		}
		s := strings.Join(args, " ")
		if nl {
			s += "\n"
		}
		io.WriteString(out, s)
		return false, 0
	case "printf":
		return false, sh.printf(args, out, errw)
	case "pwd":
		fmt.Fprintln(out, sh.cwd)
		return false, 0
	case "cd":
		dir := sh.env["HOME"]
		if len(args) > 0 {
			dir = args[0]
		}
		abs, err := vfs.Resolve(sh.home, sh.cwd, dir)
		if err == nil {
			if n, ok := sh.tree.get(abs); !ok {
				err = fs.ErrNotExist
			} else if !n.mode.IsDir() {
				err = errors.New("Not a directory")
			}
		}
		if err != nil {
			fmt.Fprintf(errw, "sh: cd: can't cd to %s: %s\n", dir, errText(err))
			return false, 2
		}
		sh.cwd = abs
		sh.env["PWD"] = abs
		return false, 0
	case "exit":
		code := sh.status
		if len(args) > 0 {
			n, err := strconv.Atoi(args[0])
			if err != nil || n < 0 {
				fmt.Fprintf(errw, "sh: exit: Illegal number: %s\n", args[0])
				return true, 2
			}
			code = n & 0xff
		}
		return true, code
	case "sleep":
		return false, sh.sleep(args, errw)
	case "env", "printenv":
		if len(args) == 0 {
			for _, k := range slices.Sorted(maps.Keys(sh.env)) {
				fmt.Fprintf(out, "%s=%s\n", k, sh.env[k])
			}
			return false, 0
		}
		if name == "env" {
			fmt.Fprintf(errw, "env: arguments are %v\n", errUnsupported)
			return false, 125
		}
		status := 0
		for _, k := range args {
			v, ok := sh.env[k]
			if !ok {
				status = 1
				continue
			}
			fmt.Fprintln(out, v)
		}
		return false, status
	case "cat":
		if len(args) == 0 {
			args = []string{"-"}
		}
		status := 0
		for _, a := range args {
			r := in
			if a != "-" {
				var err error
				if r, err = sh.open(a); err != nil {
					fmt.Fprintf(errw, "cat: %s: %s\n", a, errText(err))
					status = 1
					continue
				}
			}
			if _, err := io.Copy(out, r); err != nil {
				if sh.ctx.Err() != nil {
					return false, 1
				}
				fmt.Fprintf(errw, "cat: %s: %v\n", a, err)
				status = 1
			}
		}
		return false, status
	case "wc":
		return false, sh.wc(args, in, out, errw)
	case "chmod":
		if len(args) < 2 {
			fmt.Fprintln(errw, "chmod: missing operand")
			return false, 1
		}
		mode, err := strconv.ParseUint(args[0], 8, 32)
		if err != nil || mode > 0o777 {
			fmt.Fprintf(errw, "chmod: invalid mode: %q (the fake takes octal permissions)\n", args[0])
			return false, 1
		}
		status := 0
		for _, a := range args[1:] {
			abs, err := vfs.Resolve(sh.home, sh.cwd, a)
			if err == nil {
				err = sh.tree.chmod("chmod", abs, fs.FileMode(mode))
			}
			if err != nil {
				fmt.Fprintf(errw, "chmod: cannot access '%s': %s\n", a, errText(err))
				status = 1
			}
		}
		return false, status
	}
	fmt.Fprintf(errw, "sh: 1: %s: not found\n", name)
	return false, 127
}

func (sh *shell) sleep(args []string, errw io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(errw, "sleep: missing operand")
		return 1
	}
	var total time.Duration
	for _, a := range args {
		unit := time.Second
		switch {
		case strings.HasSuffix(a, "s"):
			a = a[:len(a)-1]
		case strings.HasSuffix(a, "m"):
			a, unit = a[:len(a)-1], time.Minute
		case strings.HasSuffix(a, "h"):
			a, unit = a[:len(a)-1], time.Hour
		}
		f, err := strconv.ParseFloat(a, 64)
		if err != nil || f < 0 {
			fmt.Fprintf(errw, "sleep: invalid time interval '%s'\n", a)
			return 1
		}
		total += time.Duration(f * float64(unit))
	}
	t := time.NewTimer(total)
	defer t.Stop()
	select {
	case <-t.C:
		return 0
	case <-sh.ctx.Done():
		return 128 + 15 // what a SIGTERM'd sleep reports; Run turns it into ctx's error
	}
}

func (sh *shell) wc(args []string, in io.Reader, out, errw io.Writer) int {
	var lines, words, chars bool
	var files []string
	for _, a := range args {
		if len(a) > 1 && a[0] == '-' {
			for _, f := range a[1:] {
				switch f {
				case 'l':
					lines = true
				case 'w':
					words = true
				case 'c':
					chars = true
				default:
					fmt.Fprintf(errw, "wc: invalid option -- '%c'\n", f)
					return 1
				}
			}
			continue
		}
		files = append(files, a)
	}
	if !lines && !words && !chars {
		lines, words, chars = true, true, true
	}
	count := func(r io.Reader) ([3]int64, error) {
		var n [3]int64
		buf := make([]byte, 64<<10)
		inWord := false
		for {
			m, err := r.Read(buf)
			n[0] += int64(bytes.Count(buf[:m], []byte{'\n'}))
			for _, b := range buf[:m] {
				if !words {
					break // the byte loop is the slow part; -c and -l skip it
				}
				space := b == ' ' || b == '\n' || b == '\t' || b == '\r' || b == '\v' || b == '\f'
				if !space && !inWord {
					n[1]++
				}
				inWord = !space
			}
			n[2] += int64(m)
			if err == io.EOF {
				return n, nil
			}
			if err != nil {
				return n, err
			}
		}
	}
	line := func(n [3]int64, name string) {
		var f []string
		for i, on := range []bool{lines, words, chars} {
			if on {
				f = append(f, strconv.FormatInt(n[i], 10))
			}
		}
		if name != "" {
			f = append(f, name)
		}
		fmt.Fprintln(out, strings.Join(f, " "))
	}
	if len(files) == 0 {
		n, err := count(in)
		if err != nil {
			return 1
		}
		line(n, "")
		return 0
	}
	status := 0
	var total [3]int64
	for _, name := range files {
		r, err := sh.open(name)
		if err != nil {
			fmt.Fprintf(errw, "wc: %s: %s\n", name, errText(err))
			status = 1
			continue
		}
		n, err := count(r)
		if err != nil {
			return 1
		}
		for i := range total {
			total[i] += n[i]
		}
		line(n, name)
	}
	if len(files) > 1 {
		line(total, "total")
	}
	return status
}

// printf implements the POSIX subset the doc comment lists, reusing the
// format while arguments remain.
func (sh *shell) printf(args []string, out, errw io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(errw, "printf: usage: printf format [arguments]")
		return 2
	}
	format, args := args[0], args[1:]
	var b strings.Builder
	status := 0
	for {
		used := 0
		next := func() string {
			if len(args) == 0 {
				return ""
			}
			used++
			a := args[0]
			args = args[1:]
			return a
		}
		for i := 0; i < len(format); i++ {
			c := format[i]
			switch {
			case c == '\\' && i+1 < len(format):
				i++
				switch e := format[i]; e {
				case 'n':
					b.WriteByte('\n')
				case 't':
					b.WriteByte('\t')
				case 'r':
					b.WriteByte('\r')
				case 'a':
					b.WriteByte('\a')
				case 'b':
					b.WriteByte('\b')
				case 'f':
					b.WriteByte('\f')
				case 'v':
					b.WriteByte('\v')
				case '\\':
					b.WriteByte('\\')
				case '0':
					v, n := 0, 0
					for n < 3 && i+1 < len(format) && format[i+1] >= '0' && format[i+1] <= '7' {
						v = v*8 + int(format[i+1]-'0')
						i++
						n++
					}
					b.WriteByte(byte(v))
				default:
					b.WriteByte('\\')
					b.WriteByte(e)
				}
			case c == '%' && i+1 < len(format):
				i++
				switch v := format[i]; v {
				case '%':
					b.WriteByte('%')
				case 's':
					b.WriteString(next())
				case 'c':
					if a := next(); a != "" {
						b.WriteByte(a[0])
					}
				case 'd', 'i':
					a := next()
					n, err := strconv.ParseInt(strings.TrimSpace(a), 0, 64)
					if err != nil && a != "" {
						fmt.Fprintf(errw, "printf: %s: invalid number\n", a)
						status = 1
					}
					b.WriteString(strconv.FormatInt(n, 10))
				default:
					fmt.Fprintf(errw, "printf: %%%c: %v\n", v, errUnsupported)
					io.WriteString(out, b.String())
					return 1
				}
			default:
				b.WriteByte(c)
			}
		}
		if used == 0 || len(args) == 0 {
			break
		}
	}
	io.WriteString(out, b.String())
	return status
}
