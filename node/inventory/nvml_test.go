package inventory

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	mockserver "github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpuplane/gpuplane/internal/catalog"
)

func TestDetectReadsDGXA100(t *testing.T) {
	server := dgxa100.New()
	res, err := Detect(Options{NodeName: "n1", Lib: server})
	if err != nil {
		t.Fatal(err)
	}
	cards := res.Cards
	if len(cards) != 8 {
		t.Fatalf("got %d cards, want 8", len(cards))
	}
	seen := map[string]bool{}
	for i, c := range cards {
		want := server.Devices[i].(*mockserver.Device).UUID
		if c.GetIndex() != uint32(i) || c.GetUuid() != want {
			t.Errorf("card %d: index %d uuid %q, want index %d uuid %q", i, c.GetIndex(), c.GetUuid(), i, want)
		}
		if seen[c.GetUuid()] {
			t.Errorf("card %d: duplicate UUID %q", i, c.GetUuid())
		}
		seen[c.GetUuid()] = true
		if c.GetDevice() != "a100-40gb" || c.GetProduct() != "Mock NVIDIA A100-SXM4-40GB" {
			t.Errorf("card %d: device %q product %q, want a100-40gb", i, c.GetDevice(), c.GetProduct())
		}
		if c.GetMemoryMib() != 40960 || c.GetArchitecture() != "ampere" || c.GetFp8() || !c.GetHealthy() {
			t.Errorf("card %d: memory %d arch %q fp8 %t healthy %t, want 40960 ampere false true",
				i, c.GetMemoryMib(), c.GetArchitecture(), c.GetFp8(), c.GetHealthy())
		}
	}
	if n, m := len(server.InitCalls()), len(server.ShutdownCalls()); n != 1 || m != 1 {
		t.Errorf("Init called %d times and Shutdown %d, want once each", n, m)
	}
}

func TestDetectUnknownProductAndFailedReads(t *testing.T) {
	server := dgxa100.New()
	dev := func(i int) *mockserver.Device { return server.Devices[i].(*mockserver.Device) }
	dev(1).GetNameFunc = func() (string, nvml.Return) { return "NVIDIA B200", nvml.SUCCESS }
	dev(1).GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) {
		return nvml.DEVICE_ARCH_BLACKWELL, nvml.SUCCESS
	}
	// Old drivers lack GetArchitecture: the catalog's answer stands.
	dev(2).GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return 0, nvml.ERROR_FUNCTION_NOT_FOUND }
	dev(3).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
	// Unknown and unsized: the state machine would reject the whole node.
	dev(4).GetNameFunc = func() (string, nvml.Return) { return "Quadro ??", nvml.SUCCESS }
	dev(4).GetMemoryInfoFunc = dev(3).GetMemoryInfoFunc

	res, err := Detect(Options{NodeName: "n1", Lib: server})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Cards) != 7 {
		t.Fatalf("got %d cards, want 7 (card 4 skipped)", len(res.Cards))
	}
	b200 := res.Cards[1]
	if b200.GetDevice() != "nvidia-b200" || b200.GetArchitecture() != "blackwell" || b200.GetMemoryMib() != 40960 {
		t.Errorf("unknown product: device %q arch %q memory %d, want nvidia-b200 blackwell 40960",
			b200.GetDevice(), b200.GetArchitecture(), b200.GetMemoryMib())
	}
	if a := res.Cards[2].GetArchitecture(); a != "ampere" {
		t.Errorf("architecture without NVML's answer = %q, want the catalog's ampere", a)
	}
	if c := res.Cards[3]; c.GetHealthy() || c.GetMemoryMib() != 40960 {
		t.Errorf("card with unreadable memory: healthy %t memory %d, want false and the catalog's 40960", c.GetHealthy(), c.GetMemoryMib())
	}
	wantWarnings := []string{
		`card 1: product "NVIDIA B200" is not in the device catalog; calling its kind "nvidia-b200"`,
		`card 4: skipped ` + dev(4).UUID + `: unknown product and memory unreadable: ERROR_GPU_IS_LOST`,
	}
	if strings.Join(res.Warnings, "\n") != strings.Join(wantWarnings, "\n") {
		t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(res.Warnings, "\n"), strings.Join(wantWarnings, "\n"))
	}
	want := "found 7 NVIDIA cards through NVML: a100-40gb=6,nvidia-b200=1 (1 unhealthy)"
	if res.Message != want {
		t.Errorf("message %q, want %q", res.Message, want)
	}
}

func TestDetectFailsWithoutIdentity(t *testing.T) {
	server := dgxa100.New()
	server.Devices[5].(*mockserver.Device).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	_, err := Detect(Options{NodeName: "n1", Lib: server})
	if want := "read cards through NVML: card 5: read UUID: ERROR_GPU_IS_LOST"; err == nil || err.Error() != want {
		t.Fatalf("error %v, want %q", err, want)
	}
	if n := len(server.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times after a failed read, want once", n)
	}
}

func TestSlugOf(t *testing.T) {
	for product, want := range map[string]string{
		"NVIDIA B200":               "nvidia-b200",
		"  NVIDIA RTX A6000 (48GB)": "nvidia-rtx-a6000-48gb",
		"Tesla K80":                 "tesla-k80",
		"???":                       "unknown",
		strings.Repeat("ab ", 40):   strings.Repeat("ab-", 20) + "ab", // a DNS label's 63, less the trailing '-'

	} {
		if got := slugOf(product); got != want {
			t.Errorf("slugOf(%q) = %q, want %q", product, got, want)
		}
	}
}

// TestFromSystemNVML reads this machine's cards where it has an NVIDIA driver.
func TestFromSystemNVML(t *testing.T) {
	res, err := Detect(Options{NodeName: "n1"})
	if err != nil && strings.HasPrefix(err.Error(), "no NVIDIA driver") {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res.Message)
	for _, w := range res.Warnings {
		t.Errorf("warning: %s", w)
	}
	for i, c := range res.Cards {
		if c.GetIndex() != uint32(i) || !strings.HasPrefix(c.GetUuid(), "GPU-") || c.GetMemoryMib() == 0 || !c.GetHealthy() {
			t.Errorf("card %d = %v", i, c)
		}
		if d, ok := catalog.BySlug(c.GetDevice()); ok && d.MemoryMiB != c.GetMemoryMib() {
			t.Logf("card %d: NVML reports %d MiB, the catalog says %d for %s", i, c.GetMemoryMib(), d.MemoryMiB, d.Slug)
		}
	}
}
