package metrics

import "github.com/esf-dev/esf/fabric"

var (
	_ Source       = (*fabric.Fabric)(nil)
	_ RemoteSource = (*fabric.Fabric)(nil)
)
