module github.com/esf-dev/esf/adapters/workspace/e2b

go 1.26.6

require (
	connectrpc.com/connect v1.21.1
	github.com/esf-dev/esf v0.0.0
)

require (
	golang.org/x/sys v0.50.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/esf-dev/esf => ../../..
