package etcd

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/esf-dev/esf/journal"
)

func TestConfigOptions(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := []struct {
		c         Config
		endpoints []string
		prefix    string
		tls       bool
		user      string
	}{
		{Config{URL: "etcd://h1:2379,h2:2380,h3/esf"}, []string{"http://h1:2379", "http://h2:2380", "http://h3:2379"}, "esf", false, ""},
		{Config{URL: "etcd://127.0.0.1:2379/a/b/"}, []string{"http://127.0.0.1:2379"}, "a/b/", false, ""},
		{Config{URL: "etcds://[::1]:2379/esf"}, []string{"https://[::1]:2379"}, "esf", true, ""},
		{Config{URL: "etcds://[::1]/esf"}, []string{"https://[::1]:2379"}, "esf", true, ""},
		{Config{URL: "etcd://h/esf", User: "esf", PasswordFile: pw}, []string{"http://h:2379"}, "esf", false, "esf"},
	}
	for _, tc := range good {
		o, err := tc.c.Options()
		if err != nil {
			t.Errorf("%+v: %v", tc.c, err)
			continue
		}
		if !reflect.DeepEqual(o.Endpoints, tc.endpoints) || o.Prefix != tc.prefix || (o.TLS != nil) != tc.tls || o.Username != tc.user {
			t.Errorf("%+v: got %v %q tls=%v user=%q", tc.c, o.Endpoints, o.Prefix, o.TLS != nil, o.Username)
		}
		if tc.user != "" && o.Password != "s3cret" {
			t.Errorf("password %q, want the file's first line", o.Password)
		}
	}
	for _, c := range []Config{
		{URL: "http://h:2379/esf"},
		{URL: "etcd://h:2379"},
		{URL: "etcd://h:2379/"},
		{URL: "etcd://h:2379/../x"},
		{URL: "etcd://user:pw@h:2379/esf"},
		{URL: "etcd://h:2379/esf?x=1"},
		{URL: "etcd://,h/esf"},
		{URL: "etcd://h/esf", CAFile: "/ca.pem"},
		{URL: "etcd://h/esf", User: "u"},
		{URL: "etcds://h/esf", CertFile: "/c.pem"},
	} {
		if _, err := c.Options(); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("%+v: %v, want invalid argument", c, err)
		}
	}
}
