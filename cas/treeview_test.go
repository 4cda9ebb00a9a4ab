package cas

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"
)

// TestTreeViewMatchesDecode checks that a view hands out exactly the
// entries DecodeTree decodes, finds them by name, and that TreeEncoder
// writes EncodeTree's bytes.
func TestTreeViewMatchesDecode(t *testing.T) {
	for _, tr := range []*Tree{sampleTree(), sparseTree(), {}} {
		raw, err := EncodeTree(tr)
		if err != nil {
			t.Fatal(err)
		}
		v, err := ParseTree(raw)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := DecodeTree(raw)
		if v.Len() != len(want.Entries) || !reflect.DeepEqual(v.Attr, want.Attr) {
			t.Fatalf("view has %d entries, attr %+v; want %d, %+v", v.Len(), v.Attr, len(want.Entries), want.Attr)
		}
		dirs := 0
		enc := NewTreeEncoder(want.Attr, len(want.Entries))
		for i := range want.Entries {
			w := &want.Entries[i]
			if got := v.Entry(i); !reflect.DeepEqual(got, *w) {
				t.Fatalf("entry %d = %+v, want %+v", i, got, *w)
			}
			if v.Name(i) != w.Name || v.Type(i) != w.Type {
				t.Fatalf("entry %d: name %q type %v, want %q %v", i, v.Name(i), v.Type(i), w.Name, w.Type)
			}
			if v.Linked(i) != (w.LinkGroup != "") {
				t.Fatalf("entry %d: linked = %v, link group %q", i, v.Linked(i), w.LinkGroup)
			}
			if got, ok := v.Lookup(w.Name); !ok || !reflect.DeepEqual(got, *w) {
				t.Fatalf("lookup %q = %+v, %v", w.Name, got, ok)
			}
			if _, ok := v.Lookup(w.Name + "\x01"); ok {
				t.Fatalf("lookup of a missing name found something")
			}
			if w.Type == TypeDir {
				dirs++
			}
			if err := enc.Add(w); err != nil {
				t.Fatal(err)
			}
		}
		if v.Dirs() != dirs {
			t.Fatalf("dirs = %d, want %d", v.Dirs(), dirs)
		}
		b, id, err := enc.Finish()
		if err != nil || !bytes.Equal(b, raw) || id != Sum(raw) {
			t.Fatalf("encoder wrote other bytes (err %v)", err)
		}
	}
}

func TestTreeEncoderRejects(t *testing.T) {
	e := func(name string) *Entry {
		return &Entry{Name: name, Type: TypeFIFO, Attr: Attr{Mode: 0o644}}
	}
	enc := NewTreeEncoder(Attr{Mode: 0o755}, 2)
	if err := enc.Add(e("b")); err != nil {
		t.Fatal(err)
	}
	if err := enc.Add(e("a")); err == nil {
		t.Fatal("out of order entry accepted")
	}
	enc = NewTreeEncoder(Attr{Mode: 0o755}, 2)
	_ = enc.Add(e("a"))
	if _, _, err := enc.Finish(); err == nil {
		t.Fatal("short tree accepted")
	}
	enc = NewTreeEncoder(Attr{Mode: 0o755}, 1)
	_ = enc.Add(e("a"))
	if err := enc.Add(e("b")); err == nil {
		t.Fatal("extra entry accepted")
	}
	for i, bad := range []string{"", "..", "a/b"} {
		enc = NewTreeEncoder(Attr{}, 1)
		if err := enc.Add(e(bad)); err == nil {
			t.Fatal(fmt.Sprint("bad name accepted: case ", i))
		}
	}
}
