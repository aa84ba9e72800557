package cli

import (
	"fmt"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// `gpuplane replicas logs MODEL/REPLICA [--follow]`: an engine's log, kept
// on its node across restarts; any node relays it.
func newReplicasLogsCommand(g *globals) *cobra.Command {
	var follow bool
	c := &cobra.Command{
		Use:   "logs MODEL/REPLICA [--follow]",
		Short: "Print a replica's engine log (kept across restarts); --follow streams what it writes next",
		Args:  argsNamed("MODEL/REPLICA"),
		RunE: func(cmd *cobra.Command, args []string) error {
			model, idx, ok := strings.Cut(args[0], "/")
			replica, err := strconv.ParseUint(idx, 10, 32)
			if !ok || model == "" || err != nil {
				return usageErrorf(cmd, "replica %q: want MODEL/REPLICA, e.g. chat/0", args[0])
			}
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			client := gpuplanev1connect.NewLogServiceClient(g.httpClient, api.baseURL,
				connect.WithInterceptors(headerInterceptor{token: g.token, userAgent: "gpuplane-cli/" + buildInfo().Version}))
			stream, err := client.ReplicaLogs(ctx(cmd), connect.NewRequest(&pb.ReplicaLogsRequest{
				Model: model, Replica: uint32(replica), Follow: follow,
			}))
			if err != nil {
				return err
			}
			defer stream.Close()
			for stream.Receive() {
				if _, err := g.stdout.Write(stream.Msg().GetData()); err != nil {
					return fmt.Errorf("write log: %w", err)
				}
			}
			if err := stream.Err(); err != nil && ctx(cmd).Err() == nil {
				return err
			}
			return nil
		},
	}
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep streaming what the engine writes")
	return c
}
