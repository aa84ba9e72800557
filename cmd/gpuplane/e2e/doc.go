// Package e2e tests the real gpuplane binary as a user runs it: agent
// processes on loopback ports with a data dir on disk, the CLI as a
// subprocess, curl, and a gRPC client that learns the API by reflection. The
// tests build the binary once (TestMain) and skip when no Go toolchain is on
// PATH. They kill processes with SIGKILL on purpose; everything else the unit
// tests of each package already cover in-process.
package e2e
