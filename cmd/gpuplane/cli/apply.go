package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/fsm/descriptor"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane apply|validate|delete -f FILE`: descriptor files (docs/descriptors.md).
//
// A file that does not parse is rejected as a whole, with every problem,
// before anything is sent. Once it parses, each resource is sent on its own
// and reported on its own line; a failed resource does not stop the others,
// but makes the command exit 1.

func newApplyCommand(g *globals) *cobra.Command {
	var (
		file   string
		dryRun bool
	)
	c := &cobra.Command{
		Use:   "apply -f FILE [--dry-run]",
		Short: "Create or update every resource in a descriptor file, accelerators first",
		Long: `Create or update every resource of a multi-document YAML file, in dependency
order: accelerators before the deployments that use them. Applying the same
file again changes nothing. -f - reads standard input.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.eachResource(cmd, file, (*descriptor.File).ApplyOrder, func(api *apiClients, r descriptor.Resource) error {
				return g.applyResource(cmd, api, r, dryRun)
			})
		},
	}
	addFileFlag(c, &file)
	addDryRunFlag(c, &dryRun)
	return c
}

// eachResource reads the descriptor file, then sends each of its resources,
// in the order order gives, with do: each is reported on its own line, and
// a failed one does not stop the others but makes the command exit 1.
func (g *globals) eachResource(cmd *cobra.Command, file string, order func(*descriptor.File) []descriptor.Resource, do func(*apiClients, descriptor.Resource) error) error {
	f, err := g.readDescriptor(cmd, file)
	if err != nil {
		return err
	}
	api, err := g.api(cmd)
	if err != nil {
		return err
	}
	failed := false
	for _, r := range order(f) {
		if err := do(api, r); err != nil {
			g.printError(r.Where()+": ", err)
			failed = true
		}
	}
	if failed {
		return errReported
	}
	return nil
}

func addDryRunFlag(c *cobra.Command, dryRun *bool) {
	c.Flags().BoolVar(dryRun, "dry-run", false, "check every resource against the cluster and persist nothing")
}

func (g *globals) applyResource(cmd *cobra.Command, api *apiClients, r descriptor.Resource, dryRun bool) error {
	switch r.Kind {
	case descriptor.KindAccelerator:
		resp, err := api.Accelerators.CreateAccelerator(ctx(cmd), connect.NewRequest(&pb.CreateAcceleratorRequest{
			Name:   r.Name,
			Spec:   r.Accelerator.Proto(),
			Upsert: true,
			DryRun: dryRun,
		}))
		if err != nil {
			return err
		}
		g.printWarnings(resp.Msg.GetWarnings())
		fmt.Fprintf(g.stdout, "%s %s%s\n", r.Ref(), outcomeWord(resp.Msg.GetOutcome()), dryRunSuffix(dryRun))
		return nil
	case descriptor.KindModelDeployment:
		resp, err := api.Models.ApplyModel(ctx(cmd), connect.NewRequest(&pb.ApplyModelRequest{
			Name:   r.Name,
			Spec:   r.ModelDeployment.Proto(),
			DryRun: dryRun,
		}))
		if err != nil {
			return err
		}
		g.printWarnings(resp.Msg.GetWarnings())
		fmt.Fprintf(g.stdout, "%s %s%s\n", r.Ref(), outcomeWord(resp.Msg.GetOutcome()), dryRunSuffix(dryRun))
		return nil
	default:
		return errUnknownKind(r.Kind)
	}
}

// outcomeWord is how apply reports what happened to a resource.
func outcomeWord(o pb.Outcome) string {
	if s := enumName(o.String(), "OUTCOME_"); s != "" {
		return s
	}
	return "applied"
}

func newValidateCommand(g *globals) *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "validate -f FILE",
		Short: "Check a descriptor file offline, reporting every problem",
		Long: `Check a descriptor file on its own, without contacting the cluster: syntax,
unknown fields, types, names, and the rules that need nothing but the file.
Whether devices and accelerators exist is checked by apply --dry-run.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := g.readDescriptor(cmd, file)
			if err != nil {
				return err
			}
			noun := "resources"
			if len(f.Resources) == 1 {
				noun = "resource"
			}
			fmt.Fprintf(g.stdout, "%s: %d %s valid\n", displayName(file), len(f.Resources), noun)
			return nil
		},
	}
	addFileFlag(c, &file)
	return c
}

func newDeleteCommand(g *globals) *cobra.Command {
	var (
		file   string
		dryRun bool
	)
	c := &cobra.Command{
		Use:   "delete -f FILE [--dry-run]",
		Short: "Delete the resources a descriptor file names, deployments first",
		Long: `Delete every resource a multi-document YAML file names, in dependency order:
deployments before the accelerators they use (apply's order reversed). Only
kinds and names are read from the file. With --dry-run each resource is
checked against the cluster as it is, so an accelerator whose deployments
the same file deletes is reported in use. -f - reads standard input.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.eachResource(cmd, file, (*descriptor.File).DeleteOrder, func(api *apiClients, r descriptor.Resource) error {
				return g.deleteResource(cmd, api, r, dryRun)
			})
		},
	}
	addFileFlag(c, &file)
	addDryRunFlag(c, &dryRun)
	return c
}

func (g *globals) deleteResource(cmd *cobra.Command, api *apiClients, r descriptor.Resource, dryRun bool) error {
	var warnings []string
	switch r.Kind {
	case descriptor.KindAccelerator:
		resp, err := api.Accelerators.DeleteAccelerator(ctx(cmd), connect.NewRequest(&pb.DeleteAcceleratorRequest{Name: r.Name, DryRun: dryRun}))
		if err != nil {
			return err
		}
		warnings = resp.Msg.GetWarnings()
	case descriptor.KindModelDeployment:
		resp, err := api.Models.DeleteModel(ctx(cmd), connect.NewRequest(&pb.DeleteModelRequest{Name: r.Name, DryRun: dryRun}))
		if err != nil {
			return err
		}
		warnings = resp.Msg.GetWarnings()
	default:
		return errUnknownKind(r.Kind)
	}
	g.printWarnings(warnings)
	fmt.Fprintf(g.stdout, "%s deleted%s\n", r.Ref(), dryRunSuffix(dryRun))
	return nil
}

// errUnknownKind guards against a kind the parser accepts but this command
// does not handle, which would be a bug.
func errUnknownKind(k descriptor.Kind) error {
	return fmt.Errorf("resource kind %q is not handled by this command", k)
}

func addFileFlag(c *cobra.Command, file *string) {
	c.Flags().StringVarP(file, "filename", "f", "", "descriptor file (YAML, one or more documents); - reads standard input")
	_ = c.MarkFlagFilename("filename", "yaml", "yml")
}

// readDescriptor reads and parses -f. Every problem of the file is printed;
// a missing -f is a usage error.
func (g *globals) readDescriptor(cmd *cobra.Command, file string) (*descriptor.File, error) {
	if file == "" {
		return nil, usageErrorf(cmd, "required flag -f FILE not set (use -f - for standard input)")
	}
	var (
		data []byte
		err  error
	)
	if file == "-" {
		data, err = io.ReadAll(g.stdin)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", displayName(file), err)
	}
	f, err := descriptor.Parse(data)
	var perr *descriptor.Error
	if errors.As(err, &perr) {
		for _, p := range perr.Problems {
			fmt.Fprintf(g.stderr, "error: %s\n", p)
		}
		return nil, errReported
	}
	return f, err
}

func displayName(file string) string {
	if file == "-" {
		return "<stdin>"
	}
	return strings.TrimSpace(file)
}
