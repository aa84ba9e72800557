// Package jepsen tests gpuplane the way Jepsen tests databases: five real
// `gpuplane agent` processes (three servers, two clients), each in its own
// network namespace on a private bridge, run a concurrent workload while a
// seeded nemesis partitions them with iptables, kills, pauses and restarts
// them, drops and delays their packets and changes Raft membership. Every
// operation is recorded with its call and return times; afterwards the
// checkers decide whether the history is linearizable (porcupine, per
// resource), whether every acknowledged write is in the log, whether rule 11
// (no card over-committed) held in every state the log passed through, whether
// every server holds the same log and hash chain, whether `audit verify`
// agrees, and whether the event stream skipped or repeated an entry.
//
// The package talks to gpuplane only through its binary and its Connect API.
// It must never send a packet anywhere but the namespaces it creates: every
// address it uses is on the 10.77.0.0/24 test subnet of the gpj-br0 bridge,
// and every namespace, link, rule and process it creates is named or tracked
// with the gpj prefix and removed on exit, after a failure, on SIGINT or
// SIGTERM, and (for leftovers of a killed run) at the next start.
//
// The tests run only as root with `ip` and `iptables` installed and only when
// asked (-jepsen or GPUPLANE_JEPSEN=1), so `go test ./...` skips them; see
// README.md for `make jepsen` and `make jepsen-long`.
package jepsen
