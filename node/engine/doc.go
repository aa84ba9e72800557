// Package engine turns a replica's deployment and placement into the command
// line and environment of an inference engine process (SPEC §6): one Driver
// per engine kind (vllm, llamacpp, ollama, command, sim), plus the hard-limit
// environment of the node's Enforcement (CUDA MPS or HAMi-core).
//
// It only builds commands: it never starts, watches or stops a process (the
// executor does) and never talks to the cluster. Build is a pure function of
// its Params, so golden tests (testdata/*.txt, regenerated with
// `go test ./node/engine -rewrite`) pin every driver's command line.
//
// Cards are named by UUID in CUDA_VISIBLE_DEVICES: NVML's indexes follow PCI
// bus order while CUDA enumerates fastest-first unless CUDA_DEVICE_ORDER says
// otherwise, so an index could name another card; a UUID cannot. Limits that
// CUDA reads per device (MPS's pinned memory limit) therefore use the
// ordinals the engine sees, 0..n-1 in the order of CUDA_VISIBLE_DEVICES.
//
// The sim subpackage is the built-in engine `gpuplane engine sim`.
package engine
