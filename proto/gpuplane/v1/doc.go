// Package gpuplanev1 is the Go code buf generates from the .proto files
// beside it: the log's entries and results (log.proto), the replicated state
// (state.proto, resources.proto), and the messages of the Connect API
// (api.proto, acl.proto, audit.proto, logs.proto, residency.proto), which
// docs/api.md describes. Edit the .proto files and run `buf generate`; never
// edit the generated files.
package gpuplanev1
