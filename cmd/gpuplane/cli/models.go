package cli

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/fsm/descriptor"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane models`: model deployments, the mutable resource that says what
// to serve, on which accelerator, with what share of a card.

func newModelsCommand(g *globals) *cobra.Command {
	return newGroupCommand("models", "Manage model deployments", []string{"model", "deployments"},
		newModelsListCommand(g),
		newModelsGetCommand(g),
		newModelsDeployCommand(g),
		newModelsDeleteCommand(g),
		newModelsLoadCommand(g),
		newModelsUnloadCommand(g),
	)
}

func newModelsListCommand(g *globals) *cobra.Command {
	return listCommand(g, "List model deployments with their replicas and readiness",
		func(c context.Context, api *apiClients, stale bool) ([]*pb.ModelDeployment, error) {
			resp, err := answer(api.Models.ListModels(c, connect.NewRequest(&pb.ListModelsRequest{Stale: stale})))
			return resp.GetModels(), err
		}, func(models []*pb.ModelDeployment) table { return modelTable(models, false) })
}

// Polling of `models get --wait`: quick at first, when a fresh deployment is
// usually placed within a few scheduler rounds, then at most once a second.
const (
	waitFirstPoll = 250 * time.Millisecond
	waitMaxPoll   = time.Second
)

func newModelsGetCommand(g *globals) *cobra.Command {
	var (
		stale       bool
		wait        bool
		waitTimeout time.Duration
	)
	c := &cobra.Command{
		Use:   "get NAME [--wait] [--wait-timeout 10m]",
		Short: "Show one deployment, its Ready condition and its replicas",
		Long: `Show one deployment: the columns of 'models list', then its replicas as
'replicas list' shows them. With --wait, block until the deployment is Ready
(every desired replica placed and none failed), printing each new reason it
waits on to stderr; exit 1 if it is not Ready within --wait-timeout.`,
		Example: `  gpuplane models get chat
  gpuplane models get chat --wait --wait-timeout 2m`,
		Args:              argsNamed("NAME"),
		ValidArgsFunction: g.completeNames(modelNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("wait-timeout") && !wait {
				return usageErrorf(cmd, "--wait-timeout needs --wait")
			}
			if waitTimeout <= 0 {
				return usageErrorf(cmd, "--wait-timeout must be positive, got %s", waitTimeout)
			}
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			var got *pb.GetModelResponse
			if wait {
				got, err = g.waitReady(cmd, api, args[0], waitTimeout)
			} else {
				got, err = answer(api.Models.GetModel(ctx(cmd), connect.NewRequest(&pb.GetModelRequest{Name: args[0], Stale: stale})))
			}
			if err != nil {
				return err
			}
			if g.output == outputTable {
				return modelDetail(got).with(modelWaits(ctx(cmd), api, got.GetReplicas())...).write(g.stdout)
			}
			return g.printModel(got)
		},
	}
	addStaleFlag(c, &stale)
	c.Flags().BoolVar(&wait, "wait", false, "block until the deployment is Ready")
	c.Flags().DurationVar(&waitTimeout, "wait-timeout", 10*time.Minute, "with --wait: how long to wait before giving up (exit 1)")
	return c
}

// printModel prints a deployment and its replicas: its detail, or the
// deployment's descriptor document as JSON or YAML, its replicas under
// status.replicas, so that what it prints can be applied back.
func (g *globals) printModel(m *pb.GetModelResponse) error {
	if g.output != outputTable {
		doc, err := modelDocument(m.GetModel())
		if err != nil {
			return err
		}
		var replicas []any
		for _, r := range m.GetReplicas() {
			o, err := plainMessage(r.ProtoReflect())
			if err != nil {
				return err
			}
			replicas = append(replicas, o)
		}
		status := doc[len(doc)-1].value.(object)
		doc[len(doc)-1].value = append(status, member{"replicas", append([]any{}, replicas...)})
		b, err := marshalPlain(doc)
		if err != nil {
			return err
		}
		return g.writeJSON(b)
	}
	return modelDetail(m).write(g.stdout)
}

// modelDetail is `models get`: the listing's columns (with the target TTFT
// and quantization), the aliases (endpoints on the same replicas: one
// resident copy serves them), then its replicas and adapters.
func modelDetail(m *pb.GetModelResponse) detail {
	// The REPLICAS column (running of desired) is not the replicas below.
	d := detailOf(modelTable([]*pb.ModelDeployment{m.GetModel()}, true)).relabel("Replicas", "Running/desired")
	if as := m.GetModel().GetSpec().GetAliases(); len(as) > 0 {
		d = d.with([2]string{"Aliases", strings.Join(as, ", ")})
	}
	d = d.withPart("Replicas", replicaTable(m.GetReplicas()))
	if len(m.GetModel().GetSpec().GetAdapters()) > 0 {
		d = d.withPart("Adapters", adapterTable(m.GetModel().GetSpec(), m.GetReplicas()))
	}
	return d
}

// modelWaits are the lines "Waiting" of `models get`: for each replica
// whose requests wait for its card, the wait as its controller's plan
// gives it (`residency plan`, `gpuplane ps` and the dashboard show the
// same text). None where no plan can be had.
func modelWaits(c context.Context, api *apiClients, rs []*pb.Replica) [][2]string {
	nodes := map[string]bool{}
	for _, r := range rs {
		if r.GetNode() != "" {
			nodes[r.GetNode()] = true
		}
	}
	var out [][2]string
	for _, n := range slices.Sorted(maps.Keys(nodes)) {
		p, err := api.Residency.GetPlan(c, connect.NewRequest(&pb.GetPlanRequest{Node: n}))
		if err != nil {
			continue
		}
		for _, card := range p.Msg.GetCards() {
			for _, e := range card.GetEntries() {
				for _, r := range rs {
					if r.GetNode() == n && e.GetModel() == fmt.Sprintf("%s/%d", r.GetModel(), r.GetIndex()) && e.GetWait() != "" {
						out = append(out, [2]string{"Waiting", fmt.Sprintf("replica %d: %s", r.GetIndex(), e.GetWait())})
					}
				}
			}
		}
	}
	return out
}

// waitReady polls GetModel until the deployment is Ready or timeout passes.
// Each new reason it is not Ready is printed to stderr once. A server that
// is briefly unavailable (a leader election) is polled again; any other
// error ends the wait.
func (g *globals) waitReady(cmd *cobra.Command, api *apiClients, name string, timeout time.Duration) (*pb.GetModelResponse, error) {
	c, cancel := context.WithTimeout(ctx(cmd), timeout)
	defer cancel()
	delay := waitFirstPoll
	reason, printed := "", ""
	for {
		resp, err := api.Models.GetModel(c, connect.NewRequest(&pb.GetModelRequest{Name: name}))
		switch {
		case err == nil:
			st := resp.Msg.GetModel().GetStatus()
			if st.GetReady() {
				return resp.Msg, nil
			}
			reason = st.GetReason()
			if reason != "" && reason != printed {
				fmt.Fprintf(g.stderr, "waiting for deployment %q: %s\n", name, reason)
				printed = reason
			}
		case c.Err() != nil:
			// The deadline (or an interrupt) ended the request: reported below.
		case connect.CodeOf(err) == connect.CodeUnavailable && !unreachable(err):
			reason = g.errorLines(err)[0]
		default:
			return nil, err
		}
		select {
		case <-c.Done():
			if err := ctx(cmd).Err(); err != nil {
				return nil, err
			}
			if reason == "" {
				reason = "not ready"
			}
			return nil, fmt.Errorf("timed out after %s waiting for deployment %q to become ready: %s", shortDuration(timeout), name, reason)
		case <-time.After(delay):
		}
		delay = min(2*delay, waitMaxPoll)
	}
}

// shortDuration prints a duration as a user would write it: "10m", not "10m0s".
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// modelFlags maps spec fields to the flags of `models deploy`, so that a
// violation, found here or by the server, names what the user typed.
var modelFlags = map[string]string{
	"metadata.name":                "NAME",
	"spec.model":                   "--model",
	"spec.replicas":                "--replicas",
	"spec.placement.accelerator":   "--accelerator",
	"spec.engine.kind":             "--engine",
	"spec.engine.memoryPercent":    "--memory-percent",
	"spec.engine.memory":           "--memory",
	"spec.engine.computePercent":   "--compute-percent",
	"spec.engine.maxModelLen":      "--max-model-len",
	"spec.engine.tensorParallel":   "--tensor-parallel",
	"spec.engine.pipelineParallel": "--pipeline-parallel",
	"spec.engine.startTimeout":     "--start-timeout",
	"spec.engine.quantization":     "--quantization",
	"spec.residency":               "--residency",
	"spec.priority":                "--priority",
	"spec.slo.ttftMs":              "--slo-ttft-ms",
	"spec.engine.maxAdapters":      "--max-adapters",
	"spec.adapters":                "--adapter",
	"spec.aliases":                 "--alias",
}

func newModelsDeployCommand(g *globals) *cobra.Command {
	var (
		spec         descriptor.ModelDeploymentSpec
		ints         = map[string]*int64{}
		memory       quantityFlag
		startTimeout time.Duration
		dryRun       bool
		adapters     adapterFlag
	)
	c := &cobra.Command{
		Use:   "deploy NAME --accelerator A --model URI [flags]",
		Short: "Create or update a deployment from flags (a shorthand for apply)",
		Long: `Create or update one ModelDeployment from flags, as 'apply -f' would with a
file holding only it. The flags are the whole spec: settings a flag does not
give are reset to their defaults, so redeploying with the same flags is
"unchanged" and changing one flag is "configured".`,
		Example: `  gpuplane models deploy chat --accelerator small --model /models/llama-3.1-8b --memory-percent 45 --replicas 2
  gpuplane models deploy coder --accelerator home --model /models/coder --memory-percent 60 --residency onDemand --priority background
  gpuplane models deploy big --accelerator pair --model hf://org/llm --tensor-parallel 2 --max-model-len 8192
  gpuplane models deploy chat --accelerator small --model /models/llama --memory-percent 45 --max-adapters 8 \
    --adapter sql=/adapters/sql,rank=16 --adapter legal=/adapters/legal,rank=64,tenants=acme --alias helpdesk`,
		Args:              argsNamed("NAME"),
		ValidArgsFunction: g.completeNames(modelNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			for _, f := range []string{"accelerator", "model"} {
				if !cmd.Flags().Changed(f) {
					return usageErrorf(cmd, "required flag --%s not set", f)
				}
			}
			// Only what the user set counts, as in a file: an unset
			// --memory-percent is no memory share, not a share of 0.
			for flag, v := range ints {
				if !cmd.Flags().Changed(flag) {
					continue
				}
				switch flag {
				case "replicas":
					spec.Replicas = v
				case "memory-percent":
					spec.Engine.MemoryPercent = v
				case "compute-percent":
					spec.Engine.ComputePercent = v
				case "max-model-len":
					spec.Engine.MaxModelLen = v
				case "tensor-parallel":
					spec.Engine.TensorParallel = v
				case "pipeline-parallel":
					spec.Engine.PipelineParallel = v
				case "slo-ttft-ms":
					spec.SLO = &descriptor.SLO{TTFTMs: v}
				case "max-adapters":
					spec.Engine.MaxAdapters = v
				}
			}
			if memory.set {
				spec.Engine.Memory = &memory.q
			}
			if cmd.Flags().Changed("start-timeout") {
				spec.Engine.StartTimeout = &descriptor.Duration{Duration: startTimeout}
			}
			spec.Adapters = adapters.ads
			flags := deployFlags(&adapters, spec.Aliases)
			var problems []*pb.Violation
			if v := descriptor.CheckName("metadata.name", name); v != nil {
				problems = append(problems, v)
			}
			problems = append(problems, spec.Check()...)
			if len(problems) > 0 {
				return g.reportViolations(problems, flags)
			}
			spec.SetDefaults(name)

			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Models.ApplyModel(ctx(cmd), connect.NewRequest(&pb.ApplyModelRequest{
				Name: name, Spec: spec.Proto(), DryRun: dryRun,
			}))
			if vs := violationsOf(err); len(vs) > 0 {
				return g.reportViolations(vs, flags)
			}
			if err != nil {
				return err
			}
			g.printWarnings(resp.Msg.GetWarnings())
			if g.output != outputTable && resp.Msg.GetModel() != nil {
				return g.printObject(resp.Msg.GetModel(), table{})
			}
			fmt.Fprintf(g.stdout, "%s %s%s\n", modelRef(name), outcomeWord(resp.Msg.GetOutcome()), dryRunSuffix(dryRun))
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&spec.Placement.Accelerator, "accelerator", "", "accelerator to place on (see 'gpuplane accelerators list')")
	f.StringVar(&spec.Model, "model", "", "path or URI of the weights")
	f.StringVar(&spec.Engine.Kind, "engine", descriptor.EngineKinds[0], "engine: "+strings.Join(descriptor.EngineKinds, ", "))
	intFlag := func(name string, def int64, usage string) {
		ints[name] = new(int64)
		f.Int64Var(ints[name], name, def, usage)
	}
	intFlag("replicas", descriptor.DefaultReplicas, "number of replicas")
	intFlag("memory-percent", 0, "share of one card's memory, 1..100 (or --memory)")
	f.Var(&memory, "memory", "absolute memory share per card, such as 20Gi (2³⁰ bytes a G) or 20G (10⁹ bytes a G, rounded up to a whole MiB) (or --memory-percent)")
	intFlag("compute-percent", 0, "share of a card's compute (SMs), 1..100; needs a memory share")
	intFlag("max-model-len", 0, "the engine's maximum context length")
	intFlag("tensor-parallel", descriptor.DefaultParallel, "tensor-parallel degree")
	intFlag("pipeline-parallel", descriptor.DefaultParallel, "pipeline-parallel degree")
	f.DurationVar(&startTimeout, "start-timeout", 0, "how long one start of the engine may take to become ready before the replica is Failed, such as 10m (default: the engine kind's)")
	f.StringVar(&spec.Residency, "residency", "pinned", "pinned (loaded, share reserved), warm (share reserved, may sleep) or onDemand (loaded on demand, no reservation); warm and onDemand need a shared accelerator")
	f.StringVar(&spec.Priority, "priority", "standard", "request class: interactive, standard or background")
	intFlag("slo-ttft-ms", 0, "p95 time-to-first-token target in milliseconds (default: none)")
	f.StringVar(&spec.Engine.Quantization, "quantization", "", "numeric format of the weights (bf16, fp8, awq, q4_k_m); part of the model's identity")
	f.Var(&adapters, "adapter", "a LoRA adapter on the model, such as sql=/adapters/sql,rank=16 or legal=/adapters/legal,rank=64,tenants=acme|beta (private to those tenants); repeat for more")
	intFlag("max-adapters", 0, "adapters each engine keeps on the card at once, 1..256 (default 4)")
	f.StringArrayVar(&spec.Aliases, "alias", nil, "another name the gateway serves the deployment under, on the same replicas (one resident copy); repeat for more")
	f.BoolVar(&dryRun, "dry-run", false, "check against the cluster and persist nothing")
	_ = c.RegisterFlagCompletionFunc("accelerator", g.completeFrom(acceleratorNames))
	_ = c.RegisterFlagCompletionFunc("engine", cobra.FixedCompletions(descriptor.EngineKinds, cobra.ShellCompDirectiveNoFileComp))
	_ = c.RegisterFlagCompletionFunc("residency", cobra.FixedCompletions([]string{"pinned", "warm", "onDemand"}, cobra.ShellCompDirectiveNoFileComp))
	_ = c.RegisterFlagCompletionFunc("priority", cobra.FixedCompletions([]string{"interactive", "standard", "background"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

// reportViolations prints one "error: FIELD: ..." line per violation, with
// the spec fields a command takes as flags shown as those flags.
func (g *globals) reportViolations(vs []*pb.Violation, flags map[string]string) error {
	for _, v := range vs {
		field := v.GetField()
		if flag, ok := flags[field]; ok {
			field = flag
		}
		fmt.Fprintf(g.stderr, "error: %s\n", violationLine(&pb.Violation{Field: field, Description: v.GetDescription()}))
	}
	return errReported
}

// quantityFlag is a memory quantity flag (--memory 20Gi); a malformed value
// is a usage error that names the flag, as for any other flag type.
type quantityFlag struct {
	q   descriptor.Quantity
	set bool
}

func (f *quantityFlag) String() string {
	if !f.set {
		return ""
	}
	return f.q.String()
}

func (f *quantityFlag) Set(s string) error {
	q, err := descriptor.ParseQuantity(s)
	if err != nil {
		return err
	}
	f.q, f.set = q, true
	return nil
}

func (*quantityFlag) Type() string { return "quantity" }

func newModelsDeleteCommand(g *globals) *cobra.Command {
	var dryRun bool
	c := &cobra.Command{
		Use:               "delete NAME",
		Short:             "Delete a deployment: stop its replicas and release their shares",
		Args:              argsNamed("NAME"),
		ValidArgsFunction: g.completeNames(modelNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Models.DeleteModel(ctx(cmd), connect.NewRequest(&pb.DeleteModelRequest{Name: args[0], DryRun: dryRun}))
			if err != nil {
				return err
			}
			g.printWarnings(resp.Msg.GetWarnings())
			fmt.Fprintf(g.stdout, "%s deleted%s\n", modelRef(args[0]), dryRunSuffix(dryRun))
			return nil
		},
	}
	c.Flags().BoolVar(&dryRun, "dry-run", false, "check against the cluster and persist nothing")
	return c
}

// modelRef is how commands name a deployment in their output, the same
// reference apply prints: "modeldeployment/chat".
func modelRef(name string) string {
	return descriptor.Resource{Kind: descriptor.KindModelDeployment, Name: name}.Ref()
}

// modelTable is the table of `models list`; wide (`models get`) adds the
// deployment's TTFT target and quantization.
func modelTable(models []*pb.ModelDeployment, wide bool) table {
	header := []string{"NAME", "ACCELERATOR", "ENGINE", "REPLICAS", "MEMORY/REPLICA", "RESIDENCY", "PRIORITY", "READY", "REASON"}
	if wide {
		header = slices.Insert(header, 7, "TTFT SLO", "QUANTIZATION")
	}
	return tableOf(header, models,
		func(m *pb.ModelDeployment) []string {
			spec, st := m.GetSpec(), m.GetStatus()
			row := []string{m.GetName(), spec.GetPlacement().GetAccelerator(), spec.GetEngine().GetKind(),
				fmt.Sprintf("%d/%d", st.GetRunning(), st.GetDesired()), mibOrDash(st.GetMemoryPerReplicaMib()),
				fsm.ResidencyName(spec.GetResidency()), fsm.PriorityName(spec.GetPriority()),
				titleBool(st.GetReady()), st.GetReason()}
			if wide {
				slo := ""
				if ms := spec.GetSlo().GetTtftMs(); ms > 0 {
					slo = itoa(ms) + "ms"
				}
				row = slices.Insert(row, 7, slo, spec.GetEngine().GetQuantization())
			}
			return row
		})
}

// mibOrDash is mib for a size that may be unknown (0): "-".
func mibOrDash(n uint64) string {
	if n == 0 {
		return ""
	}
	return mib(n)
}

func modelNames(cmd *cobra.Command, api *apiClients) ([]string, error) {
	resp, err := answer(api.Models.ListModels(ctx(cmd), connect.NewRequest(&pb.ListModelsRequest{Stale: true})))
	return namesOf(resp.GetModels(), err)
}
