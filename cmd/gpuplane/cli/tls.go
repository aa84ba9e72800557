package cli

import (
	"fmt"
	"net"

	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/cluster/tlsutil"
)

// `gpuplane tls`: a development CA and node certificates, made with Go's
// crypto (no openssl or cfssl needed).

func newTLSCommand(g *globals) *cobra.Command {
	return newGroupCommand("tls", "Create a development CA and node certificates", nil,
		newTLSCreateCACommand(g),
		newTLSCreateCertCommand(g),
	)
}

func newTLSCreateCACommand(g *globals) *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "create-ca",
		Short: "Create the cluster's CA (" + tlsutil.CACertFile + " and its key) in --dir",
		Args:  argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, err := tlsutil.CreateCA(dir)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "created %s (give it to every agent as --tls-ca and to the CLI as --ca)\n", path)
			fmt.Fprintf(g.stdout, "created %s (keep it private: it signs node certificates)\n", tlsutil.CAKeyFile)
			return nil
		},
	}
	c.Flags().StringVar(&dir, "dir", ".", "directory to write to")
	return c
}

func newTLSCreateCertCommand(g *globals) *cobra.Command {
	var dir, node string
	var ips, dns []string
	c := &cobra.Command{
		Use:   "create-cert --node NAME",
		Short: "Create a node certificate signed by the CA in --dir",
		Long: `Create a certificate and key for one node, signed by the CA in --dir. The
certificate names the node (its common name is how other nodes know it) and
is valid for the node name, localhost, 127.0.0.1 and ::1, plus every --ip and
--dns given: list the addresses clients use to reach the node's API.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if node == "" {
				return usageErrorf(cmd, "--node is required")
			}
			req := tlsutil.CertRequest{Node: node, DNS: dns}
			for _, s := range ips {
				ip := net.ParseIP(s)
				if ip == nil {
					return usageErrorf(cmd, "invalid --ip %q", s)
				}
				req.IPs = append(req.IPs, ip)
			}
			cert, key, err := tlsutil.CreateCert(dir, req)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "created %s (--tls-cert)\ncreated %s (--tls-key)\n", cert, key)
			return nil
		},
	}
	c.Flags().StringVar(&dir, "dir", ".", "directory holding the CA; the certificate is written there too")
	c.Flags().StringVar(&node, "node", "", "node name (the agent's --node-name)")
	c.Flags().StringSliceVar(&ips, "ip", nil, "extra IP address the node is reached at (repeatable)")
	c.Flags().StringSliceVar(&dns, "dns", nil, "extra DNS name the node is reached at (repeatable)")
	return c
}
