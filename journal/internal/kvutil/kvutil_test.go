package kvutil

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/esf-dev/esf/journal"
)

func FuzzDecodeEvent(f *testing.F) {
	f.Add(uint64(1), []byte(`{"seq":1,"time":"2030-01-01T00:00:00Z","type":"node.forked","node_id":"node_a","data":{"x":1}}`))
	f.Add(uint64(2), []byte(`{"seq":1,"type":"x.y"}`))
	f.Add(uint64(3), []byte(`{"seq":3,"type":"x.y","unknown":true}`))
	f.Fuzz(func(t *testing.T, seq uint64, b []byte) {
		ev, err := DecodeEvent(EventKey(seq), b)
		if err != nil {
			if !errors.Is(err, journal.ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if ev.Seq != seq || ev.Validate() != nil {
			t.Fatalf("accepted %+v for key seq %d", ev, seq)
		}
	})
}

func TestDecodeEventChecksKey(t *testing.T) {
	val := []byte(`{"seq":5,"time":"2030-01-01T00:00:00Z","type":"x.y"}`)
	if _, err := DecodeEvent(EventKey(5), val); err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeEvent(EventKey(6), val); !errors.Is(err, journal.ErrCorrupt) {
		t.Errorf("seq mismatch: %v", err)
	}
	if _, err := DecodeEvent([]byte("sys/ev/short"), val); !errors.Is(err, journal.ErrCorrupt) {
		t.Errorf("bad key: %v", err)
	}
}

func TestEventKeysSortBySeq(t *testing.T) {
	prev := EventKey(0)
	for _, s := range []uint64{1, 255, 256, 1 << 32, 1<<64 - 1} {
		k := EventKey(s)
		if string(k) <= string(prev) {
			t.Errorf("EventKey(%d) does not sort after the previous key", s)
		}
		if binary.BigEndian.Uint64(k[len(k)-8:]) != s {
			t.Errorf("EventKey(%d) does not end in the seq", s)
		}
		prev = k
	}
	start, end := EventRange(1<<64 - 1)
	if string(start) != string(end) {
		t.Errorf("range after the largest seq is not empty: [%q, %q)", start, end)
	}
}

func TestBroadcaster(t *testing.T) {
	var b Broadcaster
	ch1 := b.Wait()
	ch2 := b.Wait()
	if ch1 != ch2 {
		t.Error("waiters before one broadcast do not share a channel")
	}
	b.Broadcast()
	<-ch1 // a missed wake-up hangs here until the test times out
	<-ch2
	ch3 := b.Wait()
	select {
	case <-ch3:
		t.Fatal("a Wait after the broadcast is already closed")
	default:
	}
	b.Close()
	<-ch3
	<-b.Wait()
	b.Broadcast() // after Close: harmless
}
