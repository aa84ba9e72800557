package agent_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/testutil"
)

// TestSGLangThroughTheGateway: a warm deployment whose engine speaks SGLang
// strictly (a sim with dialect sglang, which frees nothing on a release
// without --enable-memory-saver and serves no adapter without
// --enable-lora) starts with SGLang's flags, loads its adapter through
// SGLang's /load_lora_adapter when a request through the gateway names it,
// releases its memory when the operator puts it to sleep (the engine holds
// its residual only), and a request through the gateway resumes it, its
// adapter still registered.
func TestSGLangThroughTheGateway(t *testing.T) {
	n := devNode(t, "sglang", agent.GatewayConfig{})
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	applyFile(t, n, `resource: ModelDeployment
resourceVersion: v1
metadata: {name: sgchat}
spec:
  model: Qwen/Qwen2.5-0.5B-Instruct
  residency: warm
  placement: {accelerator: shared}
  engine: {kind: sim, dialect: sglang, memoryPercent: 20, args: ["--tokens-per-second", "0", "--load-seconds", "0.2", "--overhead-mib", "300"]}
  adapters:
    - {name: sql, source: /adapters/sql, rank: 8}
`)
	base := n.a.GatewayURL()
	waitServed(t, base, "sgchat")
	argv, port := sglangEngine(t, "sgchat")
	for _, want := range []string{"--dialect", "--mem-fraction-static", "--enable-memory-saver", "--enable-weights-cpu-backup", "--enable-lora", "--enable-metrics"} {
		if !slices.Contains(argv, want) {
			t.Errorf("the engine runs without %s: %q", want, argv)
		}
	}
	if code, body := complete(t, base, "sgchat:sql"); code != http.StatusOK {
		t.Fatalf("request for sgchat:sql: %d %s", code, body)
	}
	awake := sglangStatus(t, port)
	if awake.State != "awake" || !slices.Equal(awake.Adapters, []string{"sql"}) {
		t.Fatalf("after a request for sgchat:sql the engine is %s with adapters %v, want awake with sql", awake.State, awake.Adapters)
	}

	gpuplane(t, n, "models", "unload", "sgchat")
	waitReplica(t, n, "sgchat", "Sleeping")
	asleep := sglangStatus(t, port)
	if asleep.State != "asleep" || asleep.MemoryMiB >= awake.MemoryMiB || asleep.MemoryMiB != 300 {
		t.Fatalf("asleep, the engine is %s holding %d MiB (awake %d MiB): want its memory released to its 300 MiB residual", asleep.State, asleep.MemoryMiB, awake.MemoryMiB)
	}

	if code, body := complete(t, base, "sgchat:sql"); code != http.StatusOK {
		t.Fatalf("request for sgchat:sql after the sleep: %d %s", code, body)
	}
	woken := sglangStatus(t, port)
	if woken.State != "awake" || woken.MemoryMiB != awake.MemoryMiB || !slices.Equal(woken.Adapters, []string{"sql"}) {
		t.Fatalf("after a request the engine is %s holding %d MiB with adapters %v, want awake at %d MiB with sql", woken.State, woken.MemoryMiB, woken.Adapters, awake.MemoryMiB)
	}
	waitReplica(t, n, "sgchat", "Resident")
}

type sglangSimStatus struct {
	State     string   `json:"state"`
	MemoryMiB uint64   `json:"memory_mib"`
	Adapters  []string `json:"adapters"`
}

// sglangStatus reads the engine's /sim/status.
func sglangStatus(t *testing.T, port string) sglangSimStatus {
	t.Helper()
	var st sglangSimStatus
	testutil.Eventually(t, 10*time.Second, "the engine's /sim/status", func() error {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%s/sim/status", port))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&st)
	})
	return st
}

// sglangEngine is the command line and --port of the running sim engine
// speaking SGLang that serves name.
func sglangEngine(t *testing.T, name string) ([]string, string) {
	t.Helper()
	var argv []string
	var port string
	testutil.Eventually(t, 10*time.Second, "the sglang engine's process", func() error {
		dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, d := range dirs {
			raw, err := os.ReadFile(d)
			if err != nil {
				continue
			}
			a := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
			i, p, dl := slices.Index(a, "--served-model-name"), slices.Index(a, "--port"), slices.Index(a, "--dialect")
			if i >= 0 && i+1 < len(a) && a[i+1] == name && p >= 0 && p+1 < len(a) && dl >= 0 && dl+1 < len(a) && a[dl+1] == "sglang" {
				argv, port = a, a[p+1]
				return nil
			}
		}
		return fmt.Errorf("no sim engine speaking sglang serves %s", name)
	})
	return argv, port
}
