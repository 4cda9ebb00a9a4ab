module github.com/esf-dev/esf/adapters/workspace/opensandbox

go 1.26.6

require github.com/esf-dev/esf v0.0.0

replace github.com/esf-dev/esf => ../../..
