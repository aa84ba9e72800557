package gateway

import (
	"slices"
	"strconv"

	"github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/internal/wireenum"
	"github.com/gpuplane/gpuplane/node/engine"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// ModelOf is a deployment as the gateway serves it, with its placed
// replicas (the cluster state's replicas of d; those on no node or card
// are left out): what its spec says of its names, class, adapters and
// context length, and of each replica's engine (kind, in-flight cap,
// slots, KV budget, priority scheduling) and residency. The agent's
// Cluster view builds its Models from the state with it.
func ModelOf(d *pb.ModelDeployment, replicas []*pb.Replica) Model {
	spec := d.GetSpec()
	m := Model{Deployment: d.GetName(), Served: spec.GetServedModelName(), Class: wireenum.Class(spec.GetPriority()),
		Aliases: spec.GetAliases(), EngineModel: engine.EngineModel(spec), AdapterIDs: engine.LlamaAdapterIDs(spec), MaxModelLen: maxModelLenOf(spec.GetEngine()), Task: taskOf(spec.GetEngine()),
		Created: d.GetCreatedUnix()}
	if ads := spec.GetAdapters(); len(ads) > 0 {
		m.Adapters = make(map[string][]string, len(ads))
		for _, a := range ads {
			m.Adapters[a.GetName()] = a.GetTenants()
		}
	}
	if m.Served == "" {
		m.Served = d.GetName()
	}
	res := spec.GetResidency()
	fronted := res == pb.Residency_RESIDENCY_WARM || res == pb.Residency_RESIDENCY_ON_DEMAND
	for _, r := range replicas {
		if r.GetNode() == "" || len(r.GetCards()) == 0 {
			continue
		}
		running := r.GetState() == pb.ReplicaState_REPLICA_STATE_RUNNING
		rp := Replica{Deployment: d.GetName(), Index: r.GetIndex(), Node: r.GetNode(), Card: r.GetCards()[0],
			Endpoint: r.GetEndpoint(), Kind: engine.ControlKind(spec.GetEngine()), Running: running,
			Fronted: fronted && len(r.GetCards()) == 1, KVTokens: kvTokensOf(spec.GetEngine()),
			PriorityScheduling: priorityScheduling(spec.GetEngine()), Slots: slotsOf(spec.GetEngine()),
			MaxInFlight: maxInFlightOf(spec.GetEngine())}
		rp.Resident = running
		if r.GetState() == pb.ReplicaState_REPLICA_STATE_FAILED && !rp.Fronted {
			rp.Failed = r.GetReason()
		}
		if rp.Fronted {
			rp.Resident = r.GetResidency() == pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT
		}
		m.Replicas = append(m.Replicas, rp)
	}
	return m
}

// kvTokensOf is an engine's KV budget in tokens where its arguments say it:
// a sim engine's --kv-pool-mib over its --kv-kib-per-token. Other engines
// size their pool from the model, which gpuplane does not read: 0
// (unknown), and the gateway's flat in-flight cap alone holds.
func kvTokensOf(e *pb.EngineSpec) int {
	if e.GetKind() != engines.Sim {
		return 0
	}
	pool, perToken := argUint(e.GetArgs(), "--kv-pool-mib"), argUint(e.GetArgs(), "--kv-kib-per-token")
	if pool == 0 || perToken == 0 {
		return 0
	}
	return int(min(pool*1024/perToken, 1<<30))
}

// priorityScheduling: the engine orders requests by their `priority` field
// (vLLM, or sim, started with --scheduling-policy priority); without the
// flag vLLM refuses a non-zero priority, so the gateway sends none.
func priorityScheduling(e *pb.EngineSpec) bool {
	if r, err := engines.Lookup(e.GetKind()); err != nil || !r.VLLMArgs {
		return false
	}
	return argValue(e.GetArgs(), "--scheduling-policy") == "priority"
}

// maxInFlightOf is how many requests an engine runs at once: the
// deployment's spec.engine.maxInFlight where set, else where the
// arguments or environment of the engine whose API it speaks say it (the
// table's ConcurrencyFlag and ConcurrencyEnv: vLLM's and sim's
// --max-num-seqs, llama.cpp's slots, Ollama's OLLAMA_NUM_PARALLEL, 1
// unless set). A sim with a dialect is read as the engine it speaks, as
// slotsOf reads it. 0: unknown (vLLM sizes its default from the card; a
// command engine's is its own), and the gateway's default cap holds.
func maxInFlightOf(e *pb.EngineSpec) int {
	if n := e.GetMaxInFlight(); n > 0 {
		return int(n)
	}
	if n := slotsOf(e); n > 0 {
		// llama.cpp, or a sim speaking it: its slots.
		return n
	}
	r, _ := engines.Speaks(e)
	return r.MaxInFlight(e)
}

// slotsOf is the slot count of an engine that runs each request in a slot
// (the table's Slots: llama.cpp, engine.LlamaSlots: its --parallel, else
// llama-server's auto 4), also for a sim speaking llama.cpp; 0 for other
// kinds.
func slotsOf(e *pb.EngineSpec) int {
	if r, _ := engines.Speaks(e); !r.Slots {
		return 0
	}
	return engine.LlamaSlots(e)
}

// maxModelLenOf is the context length of one request to an engine: its
// spec's maxModelLen unless its arguments set another (they come after it
// on the command line, so they win); a llama.cpp context (-c) is shared by
// its slots. 0: unknown.
func maxModelLenOf(e *pb.EngineSpec) int {
	n := uint64(e.GetMaxModelLen())
	r, _ := engines.Lookup(e.GetKind())
	switch {
	case r.VLLMArgs:
		if v := argUint(e.GetArgs(), "--max-model-len"); v > 0 {
			n = v
		}
	case r.Slots:
		// The driver sizes -c from maxModelLen so that each slot holds it;
		// a -c of the deployment's own (flag or LLAMA_ARG_CTX_SIZE) is
		// split between explicit slots (auto slots share one unified
		// cache, where one request may use all of it).
		if v := engine.LlamaContext(e); v > 0 {
			n = uint64(v)
		}
	}
	return int(min(n, 1<<31))
}

// taskOf is what an engine answers where its arguments say it: vLLM (and
// sim) with --runner pooling (or the older --task embed) embed only, with
// --runner generate generate only; llama.cpp embeds only with
// --embedding(s), else generates only. Others (and vLLM deciding by the
// model's architecture): any, and the engine refuses what it cannot do.
func taskOf(e *pb.EngineSpec) Task {
	args := e.GetArgs()
	r, _ := engines.Lookup(e.GetKind())
	switch {
	case r.VLLMArgs:
		switch argValue(args, "--runner") {
		case "pooling":
			return TaskEmbed
		case "generate":
			return TaskGenerate
		}
		switch argValue(args, "--task") {
		case "embed", "embedding":
			return TaskEmbed
		case "generate":
			return TaskGenerate
		}
	case r.Slots:
		if slices.Contains(args, "--embedding") || slices.Contains(args, "--embeddings") {
			return TaskEmbed
		}
		return TaskGenerate
	}
	return TaskAny
}

// argUint is the value of flag in args (--flag N or --flag=N), 0 if absent
// or not a number.
func argUint(args []string, flag string) uint64 {
	n, _ := strconv.ParseUint(argValue(args, flag), 10, 64)
	return n
}

// argValue is the value of flag in args (--flag V or --flag=V), "" if
// absent.
func argValue(args []string, flag string) string { return engines.ArgValue(args, flag) }
