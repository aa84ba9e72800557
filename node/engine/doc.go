// Package engine turns a replica's deployment and placement into the command
// line and environment of an inference engine process (docs/engines.md): one Driver
// per engine kind (vllm, llamacpp, ollama, command, sim), plus the hard-limit
// environment of the node's Enforcement (CUDA MPS or HAMi-core).
//
// Its drivers only build commands: they never start, watch or stop a process
// (the executor does) and never talk to the cluster. Build is a pure function of
// its Params, so golden tests (testdata/*.txt, regenerated with
// `go test ./node/engine -rewrite`) pin every driver's command line.
//
// Cards are named by UUID in CUDA_VISIBLE_DEVICES: NVML's indexes follow PCI
// bus order while CUDA enumerates fastest-first unless CUDA_DEVICE_ORDER says
// otherwise, so an index could name another card; a UUID cannot. Limits that
// CUDA reads per device (MPS's pinned memory limit) therefore use the
// ordinals the engine sees, 0..n-1 in the order of CUDA_VISIBLE_DEVICES.
//
// Controls (controls.go) drive a running engine's residency for the node's
// residency controller (docs/engines.md): Sleep(level), Wake, IsSleeping and
// Capabilities, over vLLM's sleep mode (/sleep, /wake_up, /is_sleeping; a
// level-2 wake reloads the weights before the KV cache comes back),
// llama.cpp's router (/models/load, /models/unload, GET /models), Ollama's
// keep_alive (/api/generate, /api/ps), and a start/stop fallback over the
// executor's Process for engines without controls. They are the only code
// here that talks to an engine; they hold no policy.
//
// AcceptsCacheSalt tells the gateway which engine kinds take a per-tenant
// `cache_salt` (vLLM, sim).
//
// The sim subpackage is the built-in engine `gpuplane engine sim`. It
// answers all three control APIs, so every driver is tested against a real
// sim engine process.
package engine
