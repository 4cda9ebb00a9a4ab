package fabric

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/esf-dev/esf/executor"
)

// A container's environment is pinned in provenance by its variables'
// names; their values (an API key handed to a sandbox) never reach it, nor
// do the host paths of bind mounts.
func TestContainerProvenanceKeepsNoSecrets(t *testing.T) {
	c := &ContainerConfig{
		Env:    []string{"PATH=/usr/bin:/bin", "OPENAI_API_KEY=sk-secret-value", "EMPTY=", "BARE"},
		Mounts: []executor.Mount{{Source: "/srv/host/secret-dir", Destination: "/data", ReadOnly: true}},
	}
	b, err := json.Marshal(c.provenance())
	if err != nil {
		t.Fatal(err)
	}
	for _, leak := range []string{"sk-secret-value", "/usr/bin", "/srv/host"} {
		if strings.Contains(string(b), leak) {
			t.Errorf("provenance holds %q: %s", leak, b)
		}
	}
	var got struct {
		Env    []string `json:"env"`
		Mounts []struct {
			Destination string `json:"destination"`
		} `json:"mounts"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got.Env, ",") != "PATH,OPENAI_API_KEY,EMPTY,BARE" || len(got.Mounts) != 1 || got.Mounts[0].Destination != "/data" {
		t.Errorf("provenance: %s", b)
	}
}
