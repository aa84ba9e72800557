package cli

import (
	"context"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/fsm/descriptor"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane accelerators`: the named, immutable placement classes.

func newAcceleratorsCommand(g *globals) *cobra.Command {
	return newGroupCommand("accelerators", "Manage accelerators: placement classes over one device kind", []string{"accelerator", "acc"},
		newAcceleratorsListCommand(g),
		newAcceleratorsGetCommand(g),
		newAcceleratorsCreateCommand(g),
		newAcceleratorsDeleteCommand(g),
	)
}

func newAcceleratorsListCommand(g *globals) *cobra.Command {
	return listCommand(g, "List accelerators with their capacity",
		func(c context.Context, api *apiClients, stale bool) ([]*pb.Accelerator, error) {
			resp, err := answer(api.Accelerators.ListAccelerators(c, connect.NewRequest(&pb.ListAcceleratorsRequest{Stale: stale})))
			return resp.GetAccelerators(), err
		}, acceleratorTable)
}

func newAcceleratorsGetCommand(g *globals) *cobra.Command {
	return getCommand(g, "Show one accelerator", acceleratorNames,
		func(c context.Context, api *apiClients, name string, stale bool) (*pb.Accelerator, error) {
			resp, err := answer(api.Accelerators.GetAccelerator(c, connect.NewRequest(&pb.GetAcceleratorRequest{Name: name, Stale: stale})))
			return resp.GetAccelerator(), err
		}, func(a *pb.Accelerator) detail { return detailOf(acceleratorTable([]*pb.Accelerator{a})) })
}

func newAcceleratorsCreateCommand(g *globals) *cobra.Command {
	var (
		spec              descriptor.AcceleratorSpec
		maxModels         int64
		devicesPerReplica int64
		dryRun            bool
	)
	c := &cobra.Command{
		Use:   "create NAME --device D [--tenancy dedicated|shared] [--max-models N] [--devices-per-replica N]",
		Short: "Create an accelerator (accelerators are immutable)",
		Example: `  gpuplane accelerators create standard --device l4
  gpuplane accelerators create small --device l4 --tenancy shared --max-models 3
  gpuplane accelerators create pair --device h100 --devices-per-replica 2`,
		Args: argsNamed("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if spec.Device == "" {
				return usageErrorf(cmd, "required flag --device not set (see 'gpuplane devices list')")
			}
			// Only what the user set counts: --max-models on a dedicated
			// accelerator is an error, its absence is not.
			if cmd.Flags().Changed("max-models") {
				spec.MaxModels = &maxModels
			}
			if cmd.Flags().Changed("devices-per-replica") {
				spec.DevicesPerReplica = &devicesPerReplica
			}
			var problems []*pb.Violation
			if v := descriptor.CheckName("NAME", name); v != nil {
				problems = append(problems, v)
			}
			// The spec's rules are the server's own (descriptor delegates
			// to fsm), printed with their field paths as the server's
			// refusal would be: one wording whichever finds the problem.
			problems = append(problems, spec.Check()...)
			if len(problems) > 0 {
				for _, v := range problems {
					fmt.Fprintf(g.stderr, "error: %s\n", violationLine(v))
				}
				return errReported
			}

			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Accelerators.CreateAccelerator(ctx(cmd), connect.NewRequest(&pb.CreateAcceleratorRequest{
				Name:   name,
				Spec:   spec.Proto(),
				DryRun: dryRun,
			}))
			if err != nil {
				return err
			}
			g.printWarnings(resp.Msg.GetWarnings())
			if g.output != outputTable && resp.Msg.GetAccelerator() != nil {
				return g.printObject(resp.Msg.GetAccelerator(), table{})
			}
			fmt.Fprintf(g.stdout, "accelerator/%s created%s\n", name, dryRunSuffix(dryRun))
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&spec.Device, "device", "", "device kind to place on (see 'gpuplane devices list')")
	f.StringVar(&spec.Tenancy, "tenancy", "dedicated", "dedicated (a replica gets whole cards) or shared (models split a card's memory)")
	f.Int64Var(&maxModels, "max-models", descriptor.DefaultSharedMaxModels, "shared only: models per card")
	f.Int64Var(&devicesPerReplica, "devices-per-replica", descriptor.DefaultDevicesPerReplica, "dedicated only: whole cards per replica, on one node")
	f.BoolVar(&dryRun, "dry-run", false, "check against the cluster and persist nothing")
	_ = c.RegisterFlagCompletionFunc("tenancy", cobra.FixedCompletions([]string{"dedicated", "shared"}, cobra.ShellCompDirectiveNoFileComp))
	_ = c.RegisterFlagCompletionFunc("device", g.completeFrom(deviceNames))
	return c
}

func newAcceleratorsDeleteCommand(g *globals) *cobra.Command {
	var force, dryRun bool
	c := &cobra.Command{
		Use:               "delete NAME [--force]",
		Short:             "Delete an accelerator; refused while deployments use it unless --force",
		Args:              argsNamed("NAME"),
		ValidArgsFunction: g.completeNames(acceleratorNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Accelerators.DeleteAccelerator(ctx(cmd), connect.NewRequest(&pb.DeleteAcceleratorRequest{
				Name: args[0], Force: force, DryRun: dryRun,
			}))
			if err != nil {
				return err
			}
			g.printWarnings(resp.Msg.GetWarnings())
			fmt.Fprintf(g.stdout, "accelerator/%s deleted%s\n", args[0], dryRunSuffix(dryRun))
			return nil
		},
	}
	c.Flags().BoolVar(&force, "force", false, "delete even while deployments use it; they stay pending")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "check against the cluster and persist nothing")
	return c
}

func acceleratorTable(accs []*pb.Accelerator) table {
	return tableOf([]string{"NAME", "DEVICE", "TENANCY", "CARDS/REPLICA", "MEMORY/MODEL", "IN USE", "CAN PLACE", "READY"}, accs,
		func(a *pb.Accelerator) []string {
			spec, status := a.GetSpec(), a.GetStatus()
			return []string{a.GetName(), spec.GetDevice(), tenancyTitle(spec.GetTenancy()), itoa(cardsPerReplica(spec)),
				mib(status.GetMemoryPerModelMib()), itoa(status.GetInUse()), itoa(status.GetCanPlace()), titleBool(status.GetReady())}
		})
}

// tenancyTitle shows a tenancy capitalised: "Dedicated", "Shared".
func tenancyTitle(t pb.Tenancy) string {
	s := enumName(t.String(), "TENANCY_")
	if s == "" {
		return ""
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// cardsPerReplica is devicesPerReplica for a dedicated accelerator and 1 for
// a shared one, whose replicas split a single card.
func cardsPerReplica(s *pb.AcceleratorSpec) uint32 {
	if s.GetTenancy() == pb.Tenancy_TENANCY_SHARED || s.GetDevicesPerReplica() == 0 {
		return 1
	}
	return s.GetDevicesPerReplica()
}

func acceleratorNames(cmd *cobra.Command, api *apiClients) ([]string, error) {
	resp, err := answer(api.Accelerators.ListAccelerators(ctx(cmd), connect.NewRequest(&pb.ListAcceleratorsRequest{Stale: true})))
	return namesOf(resp.GetAccelerators(), err)
}

func dryRunSuffix(dryRun bool) string {
	if dryRun {
		return " (dry run)"
	}
	return ""
}
