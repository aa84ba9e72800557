package cli

import (
	"github.com/spf13/cobra"
)

func newCompletionCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script",
		Long: `Print a completion script for bash, zsh or fish. For example:

  source <(gpuplane completion bash)
  gpuplane completion zsh > "${fpath[1]}/_gpuplane"
  gpuplane completion fish > ~/.config/fish/completions/gpuplane.fish`,
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args: func(cmd *cobra.Command, args []string) error {
			if err := argsNamed("SHELL")(cmd, args); err != nil {
				return err
			}
			switch args[0] {
			case "bash", "zsh", "fish":
				return nil
			}
			return usageErrorf(cmd, "unsupported shell %q: want bash, zsh or fish", args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			root := cmd.Root()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(g.stdout, true)
			case "zsh":
				return root.GenZshCompletion(g.stdout)
			default:
				return root.GenFishCompletion(g.stdout, true)
			}
		},
	}
}

// completeNames completes the NAME argument of a command from the API.
func (g *globals) completeNames(list func(*cobra.Command, *apiClients) ([]string, error)) cobra.CompletionFunc {
	complete := g.completeFrom(list)
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp // NAME is the only argument
		}
		return complete(cmd, args, toComplete)
	}
}

// completeFrom completes with the names list returns (stale reads are
// fine); without a reachable API it offers nothing, rather than file names.
func (g *globals) completeFrom(list func(*cobra.Command, *apiClients) ([]string, error)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		api, err := g.api(cmd)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		names, err := list(cmd, api)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}
