package opensandbox

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// maxEventLine bounds one line of the event stream. execd sends one output
// line per event, so a command printing a gigabyte without a newline is
// refused here rather than buffered.
const maxEventLine = 16 << 20

// streamEvent is execd's ServerStreamEvent. Older servers put the error
// fields at the top level; both shapes are read.
type streamEvent struct {
	Type          string       `json:"type"`
	Text          string       `json:"text"`
	ExecutionTime int64        `json:"execution_time"`
	Error         *streamError `json:"error"`
	EName         string       `json:"ename"`
	EValue        string       `json:"evalue"`
	Traceback     []string     `json:"traceback"`
}

type streamError struct {
	EName     string   `json:"ename"`
	EValue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

func (e *streamEvent) err() streamError {
	if e.Error != nil {
		return *e.Error
	}
	return streamError{EName: e.EName, EValue: e.EValue, Traceback: e.Traceback}
}

// eventReader decodes execd's command stream. The spec calls it
// text/event-stream, but execd writes each event as a bare JSON object
// followed by a blank line; standard "data:" framing is read too, so a proxy
// that rewrites the stream (or a future execd) still parses.
type eventReader struct {
	br  *bufio.Reader
	max int // longest line accepted
}

func newEventReader(r io.Reader) *eventReader {
	return &eventReader{br: bufio.NewReaderSize(r, 64<<10), max: maxEventLine}
}

// next returns the next event, io.EOF at a clean end of stream.
func (r *eventReader) next() (streamEvent, error) {
	var data [][]byte
	for {
		line, err := r.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) && len(data) > 0 {
				return decodeEvent(data)
			}
			return streamEvent{}, err
		}
		switch {
		case len(line) == 0:
			if len(data) > 0 {
				return decodeEvent(data)
			}
		case line[0] == '{':
			data = append(data, line)
		case line[0] == ':':
			// comment / keep-alive
		default:
			field, value, _ := bytes.Cut(line, []byte(":"))
			if string(field) == "data" {
				data = append(data, bytes.TrimPrefix(value, []byte(" ")))
			}
			// "event:", "id:", "retry:" carry nothing execd relies on.
		}
	}
}

func (r *eventReader) readLine() ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > r.max {
			return nil, fmt.Errorf("opensandbox run: event line longer than %d bytes", r.max)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) && len(line) > 0 {
				return bytes.TrimRight(line, "\r\n"), nil
			}
			return nil, err
		}
		return bytes.TrimRight(line, "\r\n"), nil
	}
}

func decodeEvent(data [][]byte) (streamEvent, error) {
	var ev streamEvent
	if err := json.Unmarshal(bytes.Join(data, []byte("\n")), &ev); err != nil {
		return ev, fmt.Errorf("opensandbox run: undecodable event: %w", err)
	}
	return ev, nil
}

// linuxSignals names the signals Go's ExitError prints ("signal: killed"),
// by their Linux numbers: execd runs on Linux whatever the client runs on.
var linuxSignals = map[string]int{
	"hangup": 1, "interrupt": 2, "quit": 3, "illegal instruction": 4,
	"trace/breakpoint trap": 5, "aborted": 6, "bus error": 7,
	"floating point exception": 8, "killed": 9, "user defined signal 1": 10,
	"segmentation fault": 11, "user defined signal 2": 12, "broken pipe": 13,
	"alarm clock": 14, "terminated": 15, "stack fault": 16, "child exited": 17,
	"continued": 18, "stopped (signal)": 19, "stopped": 20,
	"stopped (tty input)": 21, "stopped (tty output)": 22,
	"urgent I/O condition": 23, "CPU time limit exceeded": 24,
	"file size limit exceeded": 25, "virtual timer expired": 26,
	"profiling timer expired": 27, "window changed": 28, "I/O possible": 29,
	"power failure": 30, "bad system call": 31,
}

// exitCode reads the exit status out of an execd "error" event: evalue is
// the decimal exit code, -1 when a signal killed the process, in which case
// the traceback holds Go's "signal: <name>". ok is false when the event is
// not an exit status at all (the command could not start).
func exitCode(e streamError) (code int, ok bool) {
	n, err := strconv.Atoi(strings.TrimSpace(e.EValue))
	if err != nil {
		return 0, false
	}
	if n >= 0 {
		return n, true
	}
	for _, tb := range e.Traceback {
		name, found := strings.CutPrefix(tb, "signal: ")
		if !found {
			continue
		}
		name = strings.TrimSuffix(name, " (core dumped)")
		if sig, ok := linuxSignals[name]; ok {
			return 128 + sig, true
		}
		if num, ok := strings.CutPrefix(name, "signal "); ok {
			if sig, err := strconv.Atoi(num); err == nil {
				return 128 + sig, true
			}
		}
	}
	return n, true
}
