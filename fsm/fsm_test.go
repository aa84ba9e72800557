package fsm_test

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/datadriven"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestDataDriven runs the command streams in testdata/scripts/*.txt. Each file is a
// sequence of directives:
//
//	apply          the input is an Envelope in protobuf text format; prints the result
//	dry-run        like apply, but through DryRun; then checks nothing changed
//	state          prints nodes, devices and accelerators as tables, and the hash head
//	cards          prints each card's memory by residency (devices get) and each replica's residency
//	replay at=N    rebuilds the state from the entries applied so far, up to N, and prints it
//	snapshot       round-trips the state through Snapshot/Restore and checks equality
//	requests       prints the log time, the request window and the ids remembered
//	               (as a snapshot lists them); checks that a replay of the log agrees
//
// Regenerate expectations with: go test ./fsm -run TestDataDriven -rewrite
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/scripts", func(t *testing.T, path string) {
		f := fsm.New()
		var log [][]byte
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "apply", "dry-run":
				env := &pb.Envelope{}
				if err := prototext.Unmarshal([]byte(d.Input), env); err != nil {
					d.Fatalf(t, "parse envelope: %v", err)
				}
				if d.Cmd == "dry-run" {
					before, _ := f.Snapshot()
					res := f.DryRun(env)
					after, _ := f.Snapshot()
					if string(before) != string(after) {
						d.Fatalf(t, "dry run changed the state")
					}
					return formatResult(res)
				}
				data, err := fsm.Marshal(env)
				if err != nil {
					d.Fatalf(t, "marshal: %v", err)
				}
				log = append(log, data)
				return formatResult(f.ApplyBytes(uint64(len(log)), data))
			case "state":
				return formatState(f)
			case "cards":
				return formatCards(f)
			case "adapters":
				return formatAdapters(f)
			case "replay":
				var at int
				d.ScanArgs(t, "at", &at)
				return formatState(replay(log, at))
			case "requests":
				out := formatRequests(f)
				if replayed := formatRequests(replay(log, 0)); replayed != out {
					d.Fatalf(t, "a replay of the log remembers other ids:\n%s\nlive:\n%s", replayed, out)
				}
				return out
			case "snapshot":
				data, err := f.Snapshot()
				if err != nil {
					d.Fatalf(t, "snapshot: %v", err)
				}
				g := fsm.New()
				if err := g.Restore(data); err != nil {
					d.Fatalf(t, "restore: %v", err)
				}
				if !proto.Equal(f.State(), g.State()) {
					d.Fatalf(t, "restored state differs")
				}
				if formatState(f) != formatState(g) {
					d.Fatalf(t, "restored views differ")
				}
				h := fsm.New()
				if err := h.RestoreFrom(iotest.OneByteReader(bytes.NewReader(data))); err != nil {
					d.Fatalf(t, "restore from reader: %v", err)
				}
				if !proto.Equal(f.State(), h.State()) || h.Hash() != f.Hash() {
					d.Fatalf(t, "state restored from a reader differs")
				}
				return "restored state equals live state at index " + strconv.FormatUint(g.AppliedIndex(), 10)
			}
			d.Fatalf(t, "unknown directive %q", d.Cmd)
			return ""
		})
	})
}

// formatRequests lists what the state machine remembers of request ids: the
// log time and window they expire by, and each id still remembered with the
// index and log time of its first application.
func formatRequests(f *fsm.FSM) string {
	var b strings.Builder
	st := f.State()
	at := "none"
	if !f.LogTime().IsZero() {
		at = f.LogTime().Format(time.RFC3339)
	}
	fmt.Fprintf(&b, "log time %s window %s\n", at, f.RequestWindow())
	for _, r := range st.AppliedRequests {
		fmt.Fprintf(&b, "%s index %d at %s\n", r.RequestId, r.Result.GetIndex(), r.AppliedAt.AsTime().Format(time.RFC3339))
	}
	return b.String()
}

// replay applies the log's first upTo entries (0: all) to an empty state, as
// a server restarting without a snapshot does.
func replay(log [][]byte, upTo int) *fsm.FSM {
	f := fsm.New()
	for i, data := range log {
		if upTo != 0 && i+1 > upTo {
			break
		}
		f.ApplyBytes(uint64(i+1), data)
	}
	return f
}

func formatResult(r *pb.Result) string {
	var b strings.Builder
	code := strings.ToLower(strings.TrimPrefix(r.Code.String(), "CODE_"))
	fmt.Fprintf(&b, "%s", code)
	if r.Outcome != pb.Outcome_OUTCOME_UNSPECIFIED {
		fmt.Fprintf(&b, " %s", strings.ToLower(strings.TrimPrefix(r.Outcome.String(), "OUTCOME_")))
	}
	if r.Duplicate {
		b.WriteString(" (duplicate)")
	}
	fmt.Fprintf(&b, ": %s\n", r.Message)
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "  violation %s: %s\n", v.Field, v.Description)
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(&b, "  warning: %s\n", w)
	}
	return b.String()
}

func formatState(f *fsm.FSM) string {
	var b strings.Builder
	fmt.Fprintf(&b, "applied %d hash %s\n", f.AppliedIndex(), f.Hash()[:16])
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	if nodes := f.Nodes(); len(nodes) > 0 {
		fmt.Fprintln(w, "NODE\tROLE\tSTATUS\tCARDS")
		for _, n := range nodes {
			var cards []string
			for _, c := range n.Cards {
				cards = append(cards, fmt.Sprintf("%d:%s", c.Index, c.Device))
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", n.Name, strings.ToLower(strings.TrimPrefix(n.Role.String(), "NODE_ROLE_")), fsm.StatusName(n.Status), strings.Join(cards, ","))
		}
	}
	if devs := f.Devices(); len(devs) > 0 {
		fmt.Fprintln(w, "DEVICE\tMEMORY\tTOTAL\tFREE\tMAX/NODE")
		for _, d := range devs {
			fmt.Fprintf(w, "%s\t%dMi\t%d\t%d\t%d\n", d.Name, d.MemoryMib, d.Total, d.Free, d.MaxPerNode)
		}
	}
	if accs := f.Accelerators(); len(accs) > 0 {
		fmt.Fprintln(w, "ACCELERATOR\tDEVICE\tTENANCY\tCARDS/REPLICA\tMEMORY/MODEL\tIN USE\tCAN PLACE\tREADY")
		for _, a := range accs {
			perReplica := a.Spec.DevicesPerReplica
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%dMi\t%d\t%d\t%v\n", a.Name, a.Spec.Device, fsm.TenancyName(a.Spec.Tenancy),
				perReplica, a.Status.MemoryPerModelMib, a.Status.InUse, a.Status.CanPlace, a.Status.Ready)
		}
	}
	if models := f.Models(); len(models) > 0 {
		fmt.Fprintln(w, "MODEL\tACCELERATOR\tGEN\tREPLICAS\tMEMORY/REPLICA\tREADY\tREASON")
		for _, m := range models {
			fmt.Fprintf(w, "%s\t%s\t%d\t%d/%d placed\t%dMi\t%v\t%s\n", m.Name, m.Spec.Placement.Accelerator, m.Generation,
				m.Status.Placed, m.Status.Desired, m.Status.MemoryPerReplicaMib, m.Status.Ready, m.Status.Reason)
		}
		fmt.Fprintln(w, "REPLICA\tNODE\tCARDS\tSHARE\tSTATE\tREASON")
		for _, r := range f.Replicas("", "") {
			fmt.Fprintf(w, "%s/%d\t%s\t%v\t%d‰\t%s\t%s\n", r.Model, r.Index, r.Node, r.Cards, r.ShareMilli, fsm.ReplicaStateName(r.State), r.Reason)
		}
	}
	w.Flush()
	return b.String()
}

// formatCards prints what `devices get` shows of each card's memory, and each
// placed replica's deployment residency and where its weights are.
func formatCards(f *fsm.FSM) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CARD\tACCELERATOR\tRESERVED\tRESIDENT\tSLEEPING\tUSED\tFREE\tREPLICAS")
	for _, d := range f.Devices() {
		_, cards, _ := f.Device(d.Name)
		for _, c := range cards {
			fmt.Fprintf(w, "%s/%d\t%s\t%dMi\t%dMi\t%dMi\t%dMi\t%dMi\t%s\n", c.Node, c.Index, c.Accelerator,
				c.ReservedMib, c.ResidentMib, c.SleepingMib, c.UsedMib, c.FreeMib, strings.Join(c.Replicas, ","))
		}
	}
	models := map[string]*pb.ModelDeployment{}
	for _, m := range f.Models() {
		models[m.Name] = m
	}
	fmt.Fprintln(w, "REPLICA\tMODE\tPRIORITY\tRESIDENCY\tWHY")
	for _, r := range f.Replicas("", "") {
		spec := models[r.Model].GetSpec()
		fmt.Fprintf(w, "%s/%d\t%s\t%s\t%s\t%s\n", r.Model, r.Index, fsm.ResidencyName(spec.GetResidency()),
			fsm.PriorityName(spec.GetPriority()), fsm.ReplicaResidencyName(r.Residency), r.ResidencyReason)
	}
	w.Flush()
	return b.String()
}

// formatAdapters prints each deployment's adapters and each replica's
// report of their tiers.
func formatAdapters(f *fsm.FSM) string {
	var b strings.Builder
	for _, m := range f.Models() {
		fmt.Fprintf(&b, "%s gen %d maxAdapters %d:", m.Name, m.Generation, fsm.MaxAdaptersOf(m.Spec.GetEngine()))
		for _, a := range m.Spec.GetAdapters() {
			fmt.Fprintf(&b, " %s(rank %d%s)", a.Name, a.Rank, strings.Join(append([]string{""}, a.Tenants...), " "))
		}
		b.WriteString("\n")
	}
	for _, r := range f.Replicas("", "") {
		fmt.Fprintf(&b, "%s/%d:", r.Model, r.Index)
		for _, a := range r.Adapters {
			fmt.Fprintf(&b, " %s=%s", a.Name, fsm.AdapterTierName(a.Tier))
		}
		b.WriteString("\n")
	}
	return b.String()
}
