package engine

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/node/inventory"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestCommands pins every driver's command line and environment for
// representative deployments. Each `build` takes the placement as arguments
// and the deployment's spec (protojson) as input.
//
// Regenerate expectations with: go test ./node/engine -run TestCommands -rewrite
func TestCommands(t *testing.T) {
	// Two l4 and two h100 cards with stable UUIDs.
	cards, err := inventory.Simulated("node-a", "l4=2,h100=2")
	if err != nil {
		t.Fatal(err)
	}
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "build" {
				t.Fatalf("unknown command %q", d.Cmd)
			}
			spec := &pb.ModelSpec{}
			if err := protojson.Unmarshal([]byte(d.Input), spec); err != nil {
				t.Fatalf("spec: %v", err)
			}
			r := &pb.Replica{Model: "chat", Index: 1, Node: "node-a"}
			var idx []string
			d.ScanArgs(t, "cards", &idx)
			var p Params
			for _, s := range idx {
				i, err := strconv.Atoi(s)
				if err != nil {
					t.Fatal(err)
				}
				r.Cards = append(r.Cards, uint32(i))
				if i < len(cards) { // a card this node does not have stays unresolved
					p.Cards = append(p.Cards, cards[i])
				}
			}
			d.MaybeScanArgs(t, "memory", &r.MemoryMib)
			d.MaybeScanArgs(t, "compute", &r.ComputePercent)
			p.MaySleep = d.HasArg("maysleep")
			d.MaybeScanArgs(t, "neighbours", &p.NeighbourMiB)
			enf := Enforcement{Mode: ModeNone}
			var mode string
			if d.MaybeScanArgs(t, "enforce", &mode) {
				enf = Enforcement{Mode: Mode(mode), MPSPipeDir: DefaultMPSPipeDir, HAMiLib: "/opt/hami/libvgpu.so"}
			}
			p.Model, p.Spec, p.Replica = "chat", spec, r
			p.Host, p.Port, p.Self = "0.0.0.0", 8100, "/usr/local/bin/gpuplane"
			cmd, err := Build(p, enf)
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			return render(cmd)
		})
	})
}

// render prints a command with each flag and its value on one line.
func render(c Command) string {
	var b strings.Builder
	b.WriteString(c.Path)
	for _, a := range c.Args {
		if strings.HasPrefix(a, "-") {
			b.WriteString("\n  ")
		} else {
			b.WriteString(" ")
		}
		b.WriteString(a)
	}
	b.WriteString("\nenv:\n")
	for _, e := range c.Env {
		b.WriteString("  " + e + "\n")
	}
	b.WriteString("health: " + c.HealthPath + "\n")
	if c.Preload != nil {
		b.WriteString("preload: " + c.Preload.String() + "\n")
	}
	return b.String()
}

func TestForUnknownKind(t *testing.T) {
	if _, err := For("tgi"); err == nil || !strings.Contains(err.Error(), "known kinds: vllm, llamacpp, ollama, sglang, command, sim") {
		t.Fatalf("For(tgi) = %v, want an error naming the known kinds", err)
	}
}

func TestDetect(t *testing.T) {
	noMPS := t.TempDir()
	env := func(dir string) func(string) string {
		return func(k string) string {
			if k == "CUDA_MPS_PIPE_DIRECTORY" {
				return dir
			}
			return ""
		}
	}
	// A directory with a listening "control" socket stands for the daemon.
	mpsDir, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(mpsDir) })
	ln, err := net.Listen("unix", filepath.Join(mpsDir, "control"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lib := filepath.Join(t.TempDir(), "libvgpu.so")
	if err := os.WriteFile(lib, []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name     string
		mode     Mode
		pipeDir  string
		lib      string
		want     Mode
		wantMsg  string
		wantFail string
	}{
		{"auto finds MPS", ModeAuto, mpsDir, lib, ModeMPS, "found its control daemon at " + mpsDir + "/control", ""},
		{"auto falls back to HAMi", ModeAuto, noMPS, lib, ModeHAMi, "enforcing shares with HAMi-core: " + lib, ""},
		{"auto with neither", ModeAuto, noMPS, "", ModeNone, "no MPS control daemon at " + noMPS + "/control and no --hami-lib", ""},
		{"auto with a missing library", ModeAuto, noMPS, "/nope/libvgpu.so", ModeNone, "no such file", ""},
		{"mps forced without daemon", ModeMPS, noMPS, "", "", "", "no MPS control daemon at " + noMPS + "/control"},
		{"hami forced without library", ModeHAMi, noMPS, "", "", "", "pass --hami-lib PATH"},
		{"hami forced", ModeHAMi, mpsDir, lib, ModeHAMi, "--enforce hami", ""},
		{"none", ModeNone, mpsDir, lib, ModeNone, "--enforce none", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enf, msg, err := Detect(tc.mode, DetectOptions{HAMiLib: tc.lib, Getenv: env(tc.pipeDir)})
			if tc.wantFail != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantFail) {
					t.Fatalf("Detect = %v, %q, %v; want error containing %q", enf, msg, err, tc.wantFail)
				}
				return
			}
			if err != nil || enf.Mode != tc.want || !strings.Contains(msg, tc.wantMsg) {
				t.Fatalf("Detect = %+v, %q, %v; want mode %s and a message containing %q", enf, msg, err, tc.want, tc.wantMsg)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	if m, err := ParseMode("MPS"); err != nil || m != ModeMPS {
		t.Fatalf("ParseMode(MPS) = %q, %v", m, err)
	}
	if _, err := ParseMode("cgroups"); err == nil {
		t.Fatal("ParseMode(cgroups) succeeded")
	}
}

// TestStartTimeout checks that a deployment's startTimeout wins over its
// kind's default, and that every kind has a default shorter for the sim and
// command engines than for vLLM.
func TestStartTimeout(t *testing.T) {
	for _, kind := range engines.Kinds() {
		if StartTimeout(&pb.EngineSpec{Kind: kind}) == fallbackStartTimeout {
			t.Errorf("kind %s has no default start timeout", kind)
		}
		// Every kind of the table has a driver and controls here.
		if _, err := For(kind); err != nil {
			t.Errorf("kind %s: %v", kind, err)
		}
		if _, err := ControlsFor(kind, Target{Process: &execProcess{}}); err != nil {
			t.Errorf("kind %s: %v", kind, err)
		}
	}
	if _, err := For("tgi"); err == nil || !strings.Contains(err.Error(), `unknown engine kind "tgi"`) {
		t.Errorf("an unknown kind: %v, want it refused by the table", err)
	}
	if sim, vllm := StartTimeout(&pb.EngineSpec{Kind: KindSim}), StartTimeout(&pb.EngineSpec{Kind: KindVLLM}); sim != 2*time.Minute || vllm != 30*time.Minute {
		t.Errorf("default start timeouts: sim %s, vllm %s; want 2m0s and 30m0s", sim, vllm)
	}
	if got := StartTimeout(&pb.EngineSpec{Kind: KindVLLM, StartTimeoutSeconds: 90}); got != 90*time.Second {
		t.Errorf("startTimeout 90s gives %s", got)
	}
}

// TestMIGInstancesByUUID: a MIG instance has no index CUDA accepts in
// CUDA_VISIBLE_DEVICES, so even vLLM, which otherwise gets NVML's indexes,
// is given its UUID.
func TestMIGInstancesByUUID(t *testing.T) {
	spec := &pb.ModelSpec{Model: "/m", Engine: &pb.EngineSpec{Kind: KindVLLM}}
	p := Params{Model: "chat", Spec: spec, Port: 8100, Replica: &pb.Replica{Model: "chat", Cards: []uint32{3}},
		Cards: []*pb.Card{{Index: 3, Uuid: "MIG-4f1c2d3e-0000-5555-8888-0123456789ab", MemoryMib: 10240}}}
	cmd, err := Build(p, Enforcement{Mode: ModeNone})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cmd.Env, "CUDA_VISIBLE_DEVICES=MIG-4f1c2d3e-0000-5555-8888-0123456789ab") || slices.Contains(cmd.Env, "CUDA_VISIBLE_DEVICES=3") {
		t.Fatalf("vLLM on a MIG instance got env %v, want its MIG UUID", cmd.Env)
	}
}

// TestShareOfCard pins the one conversion from the share (MiB per card) to
// a knob in a coarser unit: the largest value whose MiB of the card, rounded
// down as the state machine rounds them, are no more than the share.
func TestShareOfCard(t *testing.T) {
	for _, c := range []struct {
		mib, card, per, want uint64
	}{
		{10365, 23034, 100, 45},     // memoryPercent 45 of an l4 comes back as 45
		{10365, 23034, 10000, 4500}, // and as 0.45
		{10000, 23034, 100, 43},     // memory 10000Mi: 43 % (9904 MiB), not 44 (10134)
		{10000, 23034, 10000, 4341}, // 0.4341 (9999 MiB), not 0.4342 (10001)
		{23034, 23034, 100, 100},
		{30000, 23034, 100, 100}, // never above the whole card
		{5, 23034, 100, 0},
		{100, 0, 100, 0}, // a card of unknown memory
	} {
		if got := shareOfCard(c.mib, c.card, c.per); got != c.want {
			t.Errorf("shareOfCard(%d MiB, card %d MiB, per %d) = %d, want %d", c.mib, c.card, c.per, got, c.want)
		}
		if c.card > 0 && c.want < c.per && c.card*c.want/c.per > c.mib {
			t.Errorf("%d/%d of a %d MiB card is more than the %d MiB share", c.want, c.per, c.card, c.mib)
		}
	}
	// A share on a card whose memory the node does not know is refused
	// rather than sized against nothing.
	spec := &pb.ModelSpec{Model: "/models/x", Engine: &pb.EngineSpec{Kind: KindVLLM, MemoryPercent: 40}}
	_, err := Build(Params{Model: "chat", Spec: spec, Port: 8100, Replica: &pb.Replica{Model: "chat", Cards: []uint32{0}, MemoryMib: 9213},
		Cards: []*pb.Card{{Index: 0, Uuid: "GPU-x"}}}, Enforcement{Mode: ModeNone})
	if err == nil || !strings.Contains(err.Error(), "a memory share of 9213 MiB per card on cards [0] whose memory this node does not know") {
		t.Fatalf("share on a card of unknown memory: %v, want the refusal", err)
	}
}
