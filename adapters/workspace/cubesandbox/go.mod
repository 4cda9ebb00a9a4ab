module github.com/esf-dev/esf/adapters/workspace/cubesandbox

go 1.26.6

require (
	github.com/esf-dev/esf v0.0.0
	github.com/esf-dev/esf/adapters/workspace/e2b v0.0.0
)

require (
	connectrpc.com/connect v1.21.1 // indirect
	golang.org/x/sys v0.50.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace (
	github.com/esf-dev/esf => ../../..
	github.com/esf-dev/esf/adapters/workspace/e2b => ../e2b
)
