package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
	"github.com/gpuplane/gpuplane/cluster/scheduler/placesim"
	example "github.com/gpuplane/gpuplane/examples/simulate"
)

// `gpuplane simulate`: the real scheduler over a synthetic cluster, in
// process. It needs no agent and sends no request.

// policyAll is the --policy value that runs every policy side by side.
const policyAll = "all"

func newSimulateCommand(g *globals) *cobra.Command {
	var nodesPath, workloadPath, policy string
	var inflate float64
	var seeds int
	c := &cobra.Command{
		Use:   "simulate --nodes FILE --workload FILE [--policy P|all] [--inflate P] [--seeds N]",
		Short: "Run the scheduler over a synthetic cluster and an arrival trace",
		Long: `Place a trace of arrivals, in order and with no departures, on a synthetic
cluster with the real scheduler, in process (no agent, no Raft, no network),
and print how well the policy packs: how many arrivals were placed, and the
share of the cluster's GPU capacity allocated when the first arrival could not
be placed and at the end.

Each file is an Alibaba openb CSV (.csv: the node list, or the pod list as the
workload) or gpuplane's YAML (.yaml, .yml). With neither --nodes nor
--workload, the openb trace is used when it is found in shared/data/openb next
to the working directory or one of its parents, or in $GPUPLANE_OPENB_DIR;
without one, the example in examples/simulate (built in).

The YAML files (docs/simulate.md has them in full):

  # nodes.yaml
  nodes:
  - name: gpu              # with count, the nodes are gpu-0, gpu-1, ...
    count: 4               # default 1
    cards: {l4: 2}         # device kind: number of cards, or a list such as
                           # [{device: l4, memoryMiB: 23034}, {device: t4, unhealthy: true}]
    labels: {zone: a}      # optional, for selectors
    cpuMilli: 32000        # optional host capacity (0: not tracked)
    memoryMiB: 131072      # optional
    down: false            # optional: a node that is not alive

  # workload.yaml
  accelerators:            # as in a descriptor's spec (docs/descriptors.md)
  - {name: small, device: l4, tenancy: shared, maxModels: 2}
  - {name: pair, device: a100, devicesPerReplica: 2}
  arrivals:                # placed in order, replica by replica; none leave
  - {deployment: chat, accelerator: small, replicas: 3, memoryPercent: 45}
  - {deployment: llm, accelerator: pair, cpuMilli: 8000, memoryMiB: 65536, selector: {zone: a}}
  - {deployment: asr, accelerator: small, memoryPercent: 60, residency: onDemand}

A shared accelerator's arrivals need memoryPercent (1..100); residency is
pinned (default), warm or onDemand. Unknown fields are errors, reported with
their line.

--policy all runs every policy and prints them side by side; -o json prints
the result object (an array of them for all).

--inflate P and --seeds N (either one turns it on) measure as the FGD paper
does: tasks are drawn from the workload with replacement, seeded, until the
arrived GPU requests reach P% of the cluster's capacity (default 130), once
per seed 1..N (default 10); the table gives the share of GPU capacity left
unallocated when 100% had arrived, the allocation at the first failure and
at the end, and the fragmentation, as mean ± standard deviation over seeds.
Tasks that no node could hold even empty are never drawn (NEVER PLACEABLE).`,
		Example: `  gpuplane simulate --policy all     # openb when found, else examples/simulate
  gpuplane simulate --nodes examples/simulate/nodes.yaml --workload examples/simulate/workload.yaml
  gpuplane simulate --nodes openb_node_list_gpu_node.csv --workload openb_pod_list_default.csv --policy fgd -o json
  gpuplane simulate --nodes openb_node_list_gpu_node.csv --workload openb_pod_list_gpuspec25.csv --policy all --inflate 130 --seeds 10`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var policies []scheduler.Policy
			if strings.EqualFold(policy, policyAll) {
				policies = scheduler.Policies()
			} else {
				p, err := scheduler.ParsePolicy(policy)
				if err != nil {
					return usageErrorf(cmd, "invalid --policy %q: want %s", policy, policyChoices())
				}
				policies = []scheduler.Policy{p}
			}
			var (
				sc  *placesim.Scenario
				err error
			)
			switch {
			case nodesPath == "" && workloadPath == "":
				dir := placesim.OpenBDir()
				if dir == "" {
					fmt.Fprintf(g.stderr, "simulate: no --nodes or --workload given and no openb trace found (shared/data/openb, $GPUPLANE_OPENB_DIR): using the example in %s and %s\n",
						example.NodesFile, example.WorkloadFile)
					sc, err = exampleScenario()
					break
				}
				fmt.Fprintf(g.stderr, "simulate: no --nodes or --workload given: using the openb trace in %s\n", dir)
				sc, err = placesim.LoadOpenB(dir)
			case nodesPath == "":
				return usageErrorf(cmd, "required flag --nodes not set (it goes with --workload)")
			case workloadPath == "":
				return usageErrorf(cmd, "required flag --workload not set (it goes with --nodes)")
			default:
				sc, err = placesim.Load(nodesPath, workloadPath)
			}
			if err != nil {
				return fmt.Errorf("simulate: %w", err)
			}
			if cmd.Flags().Changed("inflate") || cmd.Flags().Changed("seeds") {
				var sums []placesim.Summary
				for _, p := range policies {
					s, err := placesim.RunInflated(sc, p, inflate, seeds)
					if err != nil {
						return fmt.Errorf("simulate: %w", err)
					}
					sums = append(sums, s)
				}
				write := func(w io.Writer) error { return placesim.WriteSummaryTable(w, sums) }
				if len(sums) == 1 {
					return g.printValue(sums[0], write)
				}
				return g.printValue(sums, write)
			}
			var results []placesim.Result
			for _, p := range policies {
				r, err := placesim.Run(sc, p)
				if err != nil {
					return fmt.Errorf("simulate: %w", err)
				}
				results = append(results, r)
			}
			write := func(w io.Writer) error { return placesim.WriteTable(w, results) }
			if len(results) == 1 {
				return g.printValue(results[0], write)
			}
			return g.printValue(results, write)
		},
	}
	c.AddCommand(newSimulateServeCommand(g))
	c.AddCommand(newSimulateInterferenceCommand(g))
	f := c.Flags()
	f.StringVar(&nodesPath, "nodes", "", "nodes file: openb node list (.csv) or gpuplane YAML")
	f.StringVar(&workloadPath, "workload", "", "arrivals: openb pod list (.csv) or gpuplane YAML")
	f.StringVar(&policy, "policy", string(scheduler.PolicyDefault), "placement policy: "+policyChoices())
	f.Float64Var(&inflate, "inflate", placesim.DefaultInflatePercent, "draw tasks until arrived GPU requests reach this % of capacity (the FGD paper's method)")
	f.IntVar(&seeds, "seeds", 10, "inflated runs, seeds 1..N, summarised as mean ± standard deviation")
	_ = c.MarkFlagFilename("nodes", "csv", "yaml", "yml")
	_ = c.MarkFlagFilename("workload", "csv", "yaml", "yml")
	_ = c.RegisterFlagCompletionFunc("policy", cobra.FixedCompletions(append(policyNames(), policyAll), cobra.ShellCompDirectiveNoFileComp))
	return c
}

// exampleScenario is the example cluster and workload built into the
// binary (examples/simulate).
func exampleScenario() (*placesim.Scenario, error) {
	sc := &placesim.Scenario{}
	var err error
	if sc.Nodes, err = placesim.ParseNodesYAML(example.NodesFile, example.Nodes); err != nil {
		return nil, err
	}
	if sc.Accelerators, sc.Arrivals, err = placesim.ParseWorkloadYAML(example.WorkloadFile, example.Workload); err != nil {
		return nil, err
	}
	return sc, nil
}

func policyNames() []string {
	var names []string
	for _, p := range scheduler.Policies() {
		names = append(names, string(p))
	}
	return names
}

// policyChoices lists the --policy values: "gpuplane, fgd, bestfit, spread, default or all".
func policyChoices() string {
	return strings.Join(policyNames(), ", ") + ", default or " + policyAll
}
