package initproto

import (
	"encoding/binary"
	"encoding/json"
	"reflect"
	"syscall"
	"testing"
)

// rawFrame is a frame as Write sends it, for seeds.
func rawFrame(body string) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// FuzzRead feeds Read arbitrary bytes on a real socket pair, as a
// broken or hostile peer would send them: frames it reads are whole JSON
// values of at most MaxFrame bytes, everything else is an error, nothing
// panics and no read runs past the bytes sent.
func FuzzRead(f *testing.F) {
	f.Add(rawFrame(`{"args":["sh","-c","echo hi"],"env":["A=1"],"dir":"/"}`))
	f.Add(append(rawFrame(`{"pid":7}`), rawFrame(`{"status":0}`)...))
	f.Add(rawFrame(`{"err":"no such dir","dir_denied":true}`))
	f.Add(rawFrame(`not json`))
	f.Add([]byte{0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add(binary.BigEndian.AppendUint32(nil, MaxFrame+1))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := pair(t)
		go func() {
			a.Write(data)
			a.CloseWrite()
		}()
		read := 0
		for {
			var v json.RawMessage
			fds, err := Read(b, &v)
			for _, fd := range fds {
				syscall.Close(fd)
			}
			if err != nil {
				return
			}
			if len(fds) != 0 {
				t.Fatalf("%d fds from a peer that sent none", len(fds))
			}
			read += 4 + len(v)
			if read > len(data) {
				t.Fatalf("read %d bytes of frames from %d sent", read, len(data))
			}
			if !json.Valid(v) {
				t.Fatalf("frame %q is not JSON", v)
			}
		}
	})
}

// FuzzRoundTrip: a Request written is read back equal, frame boundaries
// kept, when another frame follows it.
func FuzzRoundTrip(f *testing.F) {
	f.Add("sh", "-c", "A=1", "/", 0)
	f.Add("", "\x00\xff", "", "", -1)
	f.Fuzz(func(t *testing.T, arg0, arg1, env, dir string, status int) {
		a, b := pair(t)
		req := Request{Args: []string{arg0, arg1}, Env: []string{env}, Dir: dir}
		errc := make(chan error, 1)
		go func() {
			err := Write(a, req)
			if err == nil {
				err = Write(a, Exited{Status: status})
			}
			errc <- err
		}()
		var got Request
		if _, err := Read(b, &got); err != nil {
			t.Fatal(err)
		}
		var ex Exited
		if _, err := Read(b, &ex); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		// JSON carries strings as UTF-8: invalid bytes become U+FFFD.
		want := Request{}
		wb, _ := json.Marshal(req)
		json.Unmarshal(wb, &want)
		if !reflect.DeepEqual(got, want) || ex.Status != status {
			t.Fatalf("read %+v %+v, wrote %+v %+v", got, ex, want, Exited{Status: status})
		}
	})
}
