// Package cli is the gpuplane command line as a library. Run takes the
// arguments, the standard streams and a context, so every command can be run
// and checked in-process, against an httptest server or a dev agent, the way
// tailscale's cmd/tailscale/cli is tested.
//
// One file per command group (devices.go, nodes.go, accelerators.go,
// apply.go, ...); getlist.go builds every kind's `list` and `get NAME`;
// output.go prints tables, JSON and YAML for all of them; client.go builds
// the Connect clients and turns their errors into messages.
// The CLI never decides what is valid in the cluster: it checks what it can
// offline (descriptor files, flag values) and prints what the server says.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // a request failed or the input is invalid
	exitUsage   = 2 // unknown command or flag, wrong arguments, bad flag value
)

// DefaultAddr is where the CLI looks for the API when neither --addr nor
// GPUPLANE_ADDR says otherwise.
const DefaultAddr = "http://127.0.0.1:7410"

// DefaultTLSAddr replaces DefaultAddr when a CA is given (--ca, GPUPLANE_CACERT).
const DefaultTLSAddr = "https://127.0.0.1:7410"

// Output formats accepted by -o.
const (
	outputTable = "table"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

var outputFormats = []string{outputTable, outputJSON, outputYAML}

// globals is the state every command shares: the global flags, the streams
// Run was given, and the API clients built from them. Commands (including the
// agent command in agent.go) receive it from newRootCommand.
type globals struct {
	// addr is --addr / GPUPLANE_ADDR as given; api() normalises it.
	addr string
	// output is -o: "table", "json" or "yaml" (checked before any command runs).
	output string
	// token is --token / GPUPLANE_TOKEN, sent as "Authorization: Bearer".
	token string
	// ca is --ca / GPUPLANE_CACERT: the CA that signed the agents' certificates.
	ca string

	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer

	// getenv reads the environment; tests replace it.
	getenv func(string) string
	// httpClient carries the API requests; nil means a default client.
	httpClient *http.Client

	apiOnce sync.Once
	apiVal  *apiClients
	apiErr  error
}

// Run runs the gpuplane command line with args (without the program name)
// and returns the process exit code: 0 on success, 1 when a request failed
// or the input is invalid, 2 on a usage error. Errors are written to stderr
// as "error: <message>".
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	g := &globals{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv}
	return g.run(ctx, args)
}

func (g *globals) run(ctx context.Context, args []string) int {
	if args == nil {
		args = []string{} // cobra falls back to os.Args on nil
	}
	root := newRootCommand(g)
	root.SetArgs(args)
	root.SetIn(g.stdin)
	root.SetOut(g.stdout)
	root.SetErr(g.stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var usage *usageError
	if errors.As(err, &usage) {
		fmt.Fprintf(g.stderr, "error: %s\n", usage.msg)
		fmt.Fprintf(g.stderr, "Run '%s --help' for usage.\n", usage.cmd.CommandPath())
		return exitUsage
	}
	if !errors.Is(err, errReported) {
		g.printError("", err)
	}
	return exitFailure
}

func newRootCommand(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "gpuplane",
		Short: "Share a fleet of GPUs between many ML models",
		Long: `gpuplane places ML model deployments on a fleet of GPUs and enforces each
model's memory and compute share. This command talks to any node's API
(--addr); 'gpuplane agent' runs a node.`,
		Args:          subcommandArgs,
		RunE:          showHelp,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if f := cmd.Flag("addr"); g.ca != "" && (f == nil || !f.Changed) && g.addr == DefaultAddr {
				g.addr = DefaultTLSAddr
			}
			if !slices.Contains(outputFormats, g.output) {
				return usageErrorf(cmd, "invalid output format %q for -o: want %s", g.output, strings.Join(outputFormats, ", "))
			}
			return nil
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true // completion.go has its own
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &usageError{cmd: cmd, msg: err.Error()}
	})

	addr := g.getenv("GPUPLANE_ADDR")
	if addr == "" {
		addr = DefaultAddr
		if g.getenv("GPUPLANE_CACERT") != "" {
			addr = DefaultTLSAddr
		}
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.addr, "addr", addr, "address of a gpuplane node's API (env GPUPLANE_ADDR)")
	pf.StringVarP(&g.output, "output", "o", outputTable, "output format: "+strings.Join(outputFormats, ", "))
	pf.StringVar(&g.token, "token", g.getenv("GPUPLANE_TOKEN"), "API token (env GPUPLANE_TOKEN)")
	pf.StringVar(&g.ca, "ca", g.getenv("GPUPLANE_CACERT"), "CA certificate to verify the agent's TLS certificate with; the default --addr becomes https (env GPUPLANE_CACERT)")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputFormats, cobra.ShellCompDirectiveNoFileComp))

	root.AddCommand(
		newAgentCommand(g),
		newDevicesCommand(g),
		newNodesCommand(g),
		newAcceleratorsCommand(g),
		newClusterCommand(g),
		newModelsCommand(g),
		newPsCommand(g),
		newReplicasCommand(g),
		newResidencyCommand(g),
		newApplyCommand(g),
		newValidateCommand(g),
		newDeleteCommand(g),
		newEventsCommand(g),
		newAuditCommand(g),
		newSimulateCommand(g),
		newBenchCommand(g),
		newVersionCommand(g),
		newCompletionCommand(g),
		newACLCommand(g),
		newTLSCommand(g),
		newKeygenCommand(g),
		newEngineCommand(g),
	)
	return root
}

// newGroupCommand makes a command that only holds subcommands, such as
// `devices`. Run alone it prints its help; with an unknown subcommand it is a
// usage error (cobra on its own would print help and exit 0).
func newGroupCommand(use, short string, aliases []string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:     use,
		Short:   short,
		Aliases: aliases,
		Args:    subcommandArgs,
		RunE:    showHelp,
	}
	c.AddCommand(subs...)
	return c
}

func showHelp(cmd *cobra.Command, _ []string) error { return cmd.Help() }

// subcommandArgs rejects arguments to a command that only has subcommands.
func subcommandArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, applied lazily only on its own path
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf("; did you mean %q?", s[0])
	}
	return &usageError{cmd: cmd, msg: msg}
}

// argsNamed accepts exactly the positional arguments named, in order
// (`get NAME`), and says which one is missing or extra.
func argsNamed(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < len(names):
			return usageErrorf(cmd, "missing %s", strings.Join(names[len(args):], " "))
		case len(args) > len(names):
			return usageErrorf(cmd, "unexpected argument %q", args[len(names)])
		}
		return nil
	}
}

// usageError is a mistake in how the command was invoked; Run prints it with
// a pointer to --help and exits 2.
type usageError struct {
	cmd *cobra.Command
	msg string
}

func (e *usageError) Error() string { return e.msg }

func usageErrorf(cmd *cobra.Command, format string, args ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, args...)}
}

// errReported is returned by a command that has already printed its errors
// (for instance one per resource of a file); Run only sets the exit code.
var errReported = errors.New("failed (reported above)")

// ctx returns the command's context, which Run's caller cancels on a signal.
func ctx(cmd *cobra.Command) context.Context {
	if c := cmd.Context(); c != nil {
		return c
	}
	return context.Background()
}
