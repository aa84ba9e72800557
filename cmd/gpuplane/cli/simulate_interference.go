package cli

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/node/servesim"
)

// `gpuplane simulate interference`: the interference matrix of docs/simulate.md
// in virtual time, with the simulate serve engine model and gpuplane's
// policy: the simulated half of `bench interference` (real agents and
// sim engine processes, package cmd/gpuplane/interference).
func newSimulateInterferenceCommand(g *globals) *cobra.Command {
	var (
		configPath, htmlPath, variants string
		seed                           uint64
		seconds                        float64
	)
	c := &cobra.Command{
		Use:   "interference --config FILE [--seconds S] [--variants base,adapters,...] [--html FILE] [--seed N]",
		Short: "Run the interference matrix (alone, pairs, full set × request mixes) in virtual time",
		Long: `Run each model of a simulate serve config alone, every pair, then the whole
set, under short, long, bursty and background request mixes, with the
residency controller and gateway queue the agents run, in virtual time.
It prints each model's p95 time to first token with each partner (and with
the full set) relative to running alone, under the mix where that is worst,
and flags each pair that breaks a model's target (sloTTFTSeconds) or forces
repeated reloads, with the remedy. -o json prints every cell; --html writes
a report with the heatmap.

--variants repeats the matrix on variants of the config:` + variantsHelp + `
Each variant gets its own matrix, flags and heatmap; -o json prints the
first variant's matrix at the top and every variant's under "variants".`,
		Example: `  gpuplane simulate interference --config examples/serve/home.yaml --html matrix.html`,
		Args:    argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				return usageErrorf(cmd, "required flag --config not set")
			}
			if seconds <= 0 {
				return usageErrorf(cmd, "invalid --seconds %g: must be > 0", seconds)
			}
			cfg, err := servesim.LoadConfig(configPath)
			if err != nil {
				return fmt.Errorf("simulate interference: %w", err)
			}
			vs, err := servesim.ParseVariants(variants)
			if err != nil {
				return usageErrorf(cmd, "%v", err)
			}
			all, err := servesim.MatrixVariants(cfg, vs, seed, seconds)
			if err != nil {
				return fmt.Errorf("simulate interference: %w", err)
			}
			if htmlPath != "" {
				f, err := os.Create(htmlPath)
				if err != nil {
					return fmt.Errorf("simulate interference: %w", err)
				}
				if err := servesim.WriteMatricesHTML(f, all); err != nil {
					f.Close()
					return fmt.Errorf("simulate interference: %s: %w", htmlPath, err)
				}
				if err := f.Close(); err != nil {
					return fmt.Errorf("simulate interference: %s: %w", htmlPath, err)
				}
			}
			res := variantMatrices{MatrixResult: all[0], Variants: all}
			return g.printValue(res, func(w io.Writer) error {
				for k, r := range all {
					if k > 0 {
						fmt.Fprintln(w)
					}
					if err := servesim.WriteMatrix(w, r); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	f := c.Flags()
	f.StringVar(&configPath, "config", "", "card and models (a simulate serve config, YAML)")
	f.StringVar(&htmlPath, "html", "", "also write an HTML report with the heatmap to this file")
	f.Uint64Var(&seed, "seed", 1, "seed for the request streams")
	f.StringVar(&variants, "variants", "base", "repeat the matrix on these variants, comma-separated: "+strings.Join(servesim.VariantNames(), ", ")+", or all")
	f.Float64Var(&seconds, "seconds", 600, "virtual seconds measured per cell (after a warm-up of a fifth of it)")
	_ = c.MarkFlagFilename("config", "yaml", "yml")
	return c
}

// variantMatrices is the first variant's matrix (what a run without
// --variants prints) and every variant's.
type variantMatrices struct {
	*servesim.MatrixResult
	Variants []*servesim.MatrixResult `json:"variants"`
}

// variantsHelp describes the variants for the commands' help.
var variantsHelp = func() string {
	var b strings.Builder
	for _, v := range servesim.Variants {
		fmt.Fprintf(&b, "\n  %-15s %s", v.Name, v.Doc)
	}
	return b.String() + "\n"
}()
