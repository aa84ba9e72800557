package cli

import (
	"context"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane devices`: the kinds of card in the cluster and their cards.

func newDevicesCommand(g *globals) *cobra.Command {
	return newGroupCommand("devices", "List device kinds and their cards", []string{"device"},
		newDevicesListCommand(g),
		newDevicesGetCommand(g),
	)
}

func newDevicesListCommand(g *globals) *cobra.Command {
	return listCommand(g, "List device kinds: cards in total, free, and the most on one node",
		func(c context.Context, api *apiClients, stale bool) ([]*pb.Device, error) {
			resp, err := answer(api.Devices.ListDevices(c, connect.NewRequest(&pb.ListDevicesRequest{Stale: stale})))
			return resp.GetDevices(), err
		}, deviceTable)
}

func newDevicesGetCommand(g *globals) *cobra.Command {
	return getCommand(g, "Show one device kind and its cards: who uses them and how much", deviceNames,
		func(c context.Context, api *apiClients, name string, stale bool) (*pb.GetDeviceResponse, error) {
			return answer(api.Devices.GetDevice(c, connect.NewRequest(&pb.GetDeviceRequest{Name: name, Stale: stale})))
		}, func(d *pb.GetDeviceResponse) detail {
			return detailOf(deviceTable([]*pb.Device{d.GetDevice()})).withPart("Cards", cardTable(d.GetCards()))
		})
}

func deviceTable(devices []*pb.Device) table {
	return tableOf([]string{"NAME", "PRODUCT", "MEMORY", "ARCHITECTURE", "FP8", "TOTAL", "FREE", "MAX/NODE"}, devices,
		func(d *pb.Device) []string {
			fp8 := "false"
			if d.GetFp8() {
				fp8 = "true"
			}
			return []string{d.GetName(), d.GetProduct(), mib(d.GetMemoryMib()), d.GetArchitecture(), fp8,
				itoa(d.GetTotal()), itoa(d.GetFree()), itoa(d.GetMaxPerNode())}
		})
}

// cardTable is the table of `devices get` (docs/residency.md): USED is what
// the replicas awake hold (the shares loaded now, RESIDENT, and reserved
// shares not loaded), SLEEPING what those asleep keep on the card (their
// residuals), FREE the rest; USED + SLEEPING + FREE = MEMORY. RESERVED is
// the pinned and warm shares, a promise that overlaps the others.
func cardTable(cards []*pb.CardStatus) table {
	return tableOf([]string{"NODE", "INDEX", "UUID", "MEMORY", "USED", "RESERVED", "RESIDENT", "SLEEPING", "FREE", "ACCELERATOR", "REPLICAS"}, cards,
		func(c *pb.CardStatus) []string {
			return []string{c.GetNode(), itoa(c.GetIndex()), c.GetUuid(), mib(c.GetMemoryMib()), mib(c.GetUsedMib()),
				mib(c.GetReservedMib()), mib(c.GetResidentMib()), mib(c.GetSleepingMib()),
				mib(c.GetFreeMib()), c.GetAccelerator(), strings.Join(c.GetReplicas(), ",")}
		})
}

func deviceNames(cmd *cobra.Command, api *apiClients) ([]string, error) {
	resp, err := answer(api.Devices.ListDevices(ctx(cmd), connect.NewRequest(&pb.ListDevicesRequest{Stale: true})))
	return namesOf(resp.GetDevices(), err)
}

// addStaleFlag adds --stale to a read command.
func addStaleFlag(c *cobra.Command, stale *bool) {
	c.Flags().BoolVar(stale, "stale", false, "answer from the contacted node's state without confirming it with the leader")
}
