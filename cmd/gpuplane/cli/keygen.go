package cli

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"

	"github.com/spf13/cobra"
)

// newKeygenCommand is `gpuplane keygen`: a new gossip encryption key.
func newKeygenCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "keygen",
		Short: "Print a new gossip encryption key (32 random bytes, base64) for agent --encrypt",
		Args:  argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			key := make([]byte, 32)
			if _, err := rand.Read(key); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, base64.StdEncoding.EncodeToString(key))
			return nil
		},
	}
}
