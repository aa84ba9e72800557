package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
	"github.com/gpuplane/gpuplane/cluster/scheduler/simulate"
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
to the working directory or one of its parents, or in $GPUPLANE_OPENB_DIR.

--policy all runs every policy and prints them side by side; -o json prints
the result object (an array of them for all).

--inflate P and --seeds N (either one turns it on) measure as the FGD paper
does: tasks are drawn from the workload with replacement, seeded, until the
arrived GPU requests reach P% of the cluster's capacity (default 130), once
per seed 1..N (default 10); the table gives the share of GPU capacity left
unallocated when 100% had arrived, the allocation at the first failure and
at the end, and the fragmentation, as mean ± standard deviation over seeds.
Tasks that no node could hold even empty are never drawn (NEVER PLACEABLE).`,
		Example: `  gpuplane simulate --nodes nodes.yaml --workload workload.yaml
  gpuplane simulate --policy all
  gpuplane simulate --nodes openb_node_list_gpu_node.csv --workload openb_pod_list_default.csv --policy fgd -o json`,
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
				sc  *simulate.Scenario
				err error
			)
			switch {
			case nodesPath == "" && workloadPath == "":
				dir := simulate.OpenBDir()
				if dir == "" {
					return usageErrorf(cmd, "required flags --nodes and --workload not set (and no openb trace found in shared/data/openb or $GPUPLANE_OPENB_DIR)")
				}
				fmt.Fprintf(g.stderr, "simulate: no --nodes or --workload given: using the openb trace in %s\n", dir)
				sc, err = simulate.LoadOpenB(dir)
			case nodesPath == "":
				return usageErrorf(cmd, "required flag --nodes not set (it goes with --workload)")
			case workloadPath == "":
				return usageErrorf(cmd, "required flag --workload not set (it goes with --nodes)")
			default:
				sc, err = simulate.Load(nodesPath, workloadPath)
			}
			if err != nil {
				return fmt.Errorf("simulate: %w", err)
			}
			if cmd.Flags().Changed("inflate") || cmd.Flags().Changed("seeds") {
				var sums []simulate.Summary
				for _, p := range policies {
					s, err := simulate.RunInflated(sc, p, inflate, seeds)
					if err != nil {
						return fmt.Errorf("simulate: %w", err)
					}
					sums = append(sums, s)
				}
				write := func(w io.Writer) error { return simulate.WriteSummaryTable(w, sums) }
				if len(sums) == 1 {
					return g.printValue(sums[0], write)
				}
				return g.printValue(sums, write)
			}
			var results []simulate.Result
			for _, p := range policies {
				r, err := simulate.Run(sc, p)
				if err != nil {
					return fmt.Errorf("simulate: %w", err)
				}
				results = append(results, r)
			}
			write := func(w io.Writer) error { return simulate.WriteTable(w, results) }
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
	f.Float64Var(&inflate, "inflate", simulate.DefaultInflatePercent, "draw tasks until arrived GPU requests reach this % of capacity (the FGD paper's method)")
	f.IntVar(&seeds, "seeds", 10, "inflated runs, seeds 1..N, summarised as mean ± standard deviation")
	_ = c.MarkFlagFilename("nodes", "csv", "yaml", "yml")
	_ = c.MarkFlagFilename("workload", "csv", "yaml", "yml")
	_ = c.RegisterFlagCompletionFunc("policy", cobra.FixedCompletions(append(policyNames(), policyAll), cobra.ShellCompDirectiveNoFileComp))
	return c
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
