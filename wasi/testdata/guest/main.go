// Command guest is the WebAssembly program the wasi tests run: one binary,
// many small behaviours chosen by the first argument, so the tests build
// and compile it once. It avoids fmt to keep the module (and the time
// wazero spends compiling it, long under -race) small.
package main

import (
	"io"
	"os"
	"strconv"
	"time"
)

func say(s string) { os.Stdout.WriteString(s + "\n") }

func main() {
	if len(os.Args) < 2 {
		fail("usage: guest CMD ARGS...")
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "exit":
		n, err := strconv.Atoi(arg(args, 0))
		if err != nil {
			fail(err.Error())
		}
		os.Exit(n)
	case "args":
		for _, a := range os.Args {
			say(a)
		}
	case "env":
		for _, e := range os.Environ() {
			say(e)
		}
	case "echo":
		if _, err := io.Copy(os.Stdout, os.Stdin); err != nil {
			fail(err.Error())
		}
	case "stderr":
		say("to stdout")
		os.Stderr.WriteString(arg(args, 0) + "\n")
	case "spin":
		// A loop with no calls out, so only the runtime's termination
		// checks can stop it.
		x := 0
		for {
			x++
		}
	case "sleep":
		d, err := time.ParseDuration(arg(args, 0))
		if err != nil {
			fail(err.Error())
		}
		time.Sleep(d)
	case "alloc":
		mib, err := strconv.Atoi(arg(args, 0))
		if err != nil {
			fail(err.Error())
		}
		var keep [][]byte
		for i := 0; i < mib; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			keep = append(keep, b)
		}
		say(strconv.Itoa(len(keep)))
	case "write":
		if err := os.WriteFile(arg(args, 0), []byte(arg(args, 1)), 0o644); err != nil {
			fail(err.Error())
		}
	case "read":
		b, err := os.ReadFile(arg(args, 0))
		if err != nil {
			fail(err.Error())
		}
		os.Stdout.Write(b)
	case "mkdir":
		if err := os.MkdirAll(arg(args, 0), 0o755); err != nil {
			fail(err.Error())
		}
	case "rm":
		if err := os.Remove(arg(args, 0)); err != nil {
			fail(err.Error())
		}
	case "symlink":
		if err := os.Symlink(arg(args, 0), arg(args, 1)); err != nil {
			fail(err.Error())
		}
	case "readlink":
		t, err := os.Readlink(arg(args, 0))
		if err != nil {
			fail(err.Error())
		}
		say(t)
	case "ls":
		es, err := os.ReadDir(arg(args, 0))
		if err != nil {
			fail(err.Error())
		}
		for _, e := range es {
			say(e.Name())
		}
	case "mv":
		if err := os.Rename(arg(args, 0), arg(args, 1)); err != nil {
			fail(err.Error())
		}
	case "link":
		if err := os.Link(arg(args, 0), arg(args, 1)); err != nil {
			fail(err.Error())
		}
	case "chtimes":
		sec, err := strconv.ParseInt(arg(args, 1), 10, 64)
		if err != nil {
			fail(err.Error())
		}
		if err := os.Chtimes(arg(args, 0), time.Unix(sec, 0), time.Unix(sec, 0)); err != nil {
			fail(err.Error())
		}
	case "stat":
		fi, err := os.Lstat(arg(args, 0))
		if err != nil {
			fail(err.Error())
		}
		say(fi.Mode().Type().String() + " " + strconv.FormatInt(fi.Size(), 10) + " " + strconv.FormatInt(fi.ModTime().Unix(), 10))
	case "time":
		say(strconv.FormatInt(time.Now().UnixNano(), 10))
	default:
		fail("unknown command " + os.Args[1])
	}
}

func arg(args []string, i int) string {
	if i >= len(args) {
		fail("missing argument " + strconv.Itoa(i+1))
	}
	return args[i]
}

func fail(msg string) {
	os.Stderr.WriteString("guest: " + msg + "\n")
	os.Exit(1)
}
