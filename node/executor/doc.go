// Package executor turns the replicas placed on this node into running
// engine processes (docs/engines.md) and reports what happens to them.
//
// The executor watches a Source for the replicas assigned to its node (full
// snapshots, level-triggered) and keeps one supervisor per replica. A
// supervisor starts the engine that package engine describes, with its
// cards in CUDA_VISIBLE_DEVICES and its share as the engine's flags and
// hard limits; it health-checks it, restarts it with capped exponential
// backoff when it crashes or the watchdog stops it, replaces it when the
// replica's generation or placement changes, and stops it (SIGTERM to its
// process group, SIGKILL after a grace period, then every process left of
// it) when the replica leaves the node.
//
// Each engine and all its descendants are contained (contain.go): a cgroup
// per engine where the node lets the agent make cgroups (cloned straight
// into its cgroup2 cgroup; cgroup v1 freezer, memory and pids on v1 hosts),
// else its process group, its engine id in the environment of every
// descendant, and the agent as child subreaper. A child that calls setsid
// is stopped with its engine, and HostMemory reads an engine's host memory
// from its memory cgroup.
//
// An engine is Running once it is ready: its health path answers 200, or,
// for a kind without one (a command engine), its port accepts a TCP
// connection; never while its process has exited, whatever answers on its
// port, nor while the socket listening on its port is another process's
// (ready.go). It has its start timeout to get there (spec.engine.startTimeout,
// else its kind's default, engine.StartTimeout); past it the engine is
// stopped and the replica Failed with a reason that says what the last
// probe found. A start that shows no progress for Options.StartStallTimeout
// (its probe finds the same, its log does not grow, its GPU and host memory
// do not grow) is declared stuck sooner, stopped and Failed with a reason
// that says so (progress.go).
//
// Starts on one card run side by side when the shares of every engine on
// it, starting or running, fit its memory (starts.go); an engine whose kind
// sizes itself from the card's free memory at start (vLLM, llama.cpp, and a
// command engine, which may be either: engine.StartsAlone) starts alone. A
// start counts from launch until the engine is ready or has failed, so the
// stall and start timeouts bound how long one start can hold up another. A
// replica waiting for a card is reported Placed with a reason naming the
// replica it waits for, how long that start has run (again every few
// seconds) and why they cannot start together.
//
// It reports transitions only (Placed while waiting, Starting, Running,
// Failed with a reason, Stopped), never heartbeats, through a Reporter; it
// never writes the log itself nor reads the cluster state beyond its Source.
// A replica's restart count goes on from the one the cluster recorded.
// A report that does not get through (no server reached, no leader, no
// answer) is sent again with backoff until the cluster accepts or rejects
// it or a newer status of the replica supersedes it; and when the node's
// stream starts again, a replica whose record differs from what the node
// last said is reported again: a lost report is never left waiting for the
// replica's next transition, which on a quiet node may not come.
// Each report carries the residency it implies (Loading, Resident, Cold);
// a residency controller reports its own transitions (sleep, wake, evict,
// load) with their reasons through Executor.ReportResidency (residency.go).
//
// A Gate (gate.go), the node's residency manager, may hold a replica: its
// engine starts only on StartEngine and stops on StopEngine (the replica
// stays placed, Cold), a crash is left to the Gate to retry, and the
// endpoint reported is the Gate's front rather than the engine's port.
// Replicas it does not hold (pinned ones) run exactly as described above.
//
// Every engine lives in <data-dir>/engines/<model>/<replica>/: engine.log
// and its rotated files engine.log.1 … (the process's stdout and stderr,
// kept across restarts) and pid.json (pid, process start time, engine id,
// cgroups, generation and placement of the running engine). An engine's
// output goes through a pipe to a log writer process of its own (`gpuplane
// engine log`, WriteLog) that rotates at write time, so the log never takes
// more than Options.LogMaxBytes on disk however fast the engine writes.
// Neither the engine nor its log writer needs the agent, so both survive
// it, for Options.OrphanGrace (a minute by default, the agent's
// --orphan-grace): the log writer watches the agent's mark (engines/
// agent.json: its pid and process start time) and stops its engine once no
// agent has run for that long (orphan.go). After a kill -9 of the agent, a
// new executor marks itself the agent before anything else, reads pid.json,
// adopts each engine that is still the same process and still wanted as it
// is, and
// stops every other one (cgroup and all) before starting anything, so no
// replica ever has two processes and no engine is left orphaned. A
// replica whose engine died while no agent ran is reported Failed (the
// cluster may still say Running) before it is started again.
package executor
