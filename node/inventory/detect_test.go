package inventory

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// failingInit is an NVML whose Init fails with ret, as the real one does
// without a driver.
func failingInit(ret nvml.Return) *mock.Interface {
	return &mock.Interface{InitFunc: func() nvml.Return { return ret }}
}

func TestDetect(t *testing.T) {
	noCards := &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return 0, nvml.SUCCESS },
	}
	tests := []struct {
		name      string
		opts      Options
		cards     int
		simulated bool
		message   string
		err       string
	}{{
		name:      "sim spec wins over NVML",
		opts:      Options{NodeName: "n1", SimSpec: "l4=2,h100=1", Lib: dgxa100.New()},
		cards:     3,
		simulated: true,
		message:   "simulating 3 cards (--sim-gpus): l4=2,h100=1",
	}, {
		name:      "dev without a driver simulates l4=2",
		opts:      Options{NodeName: "n1", Dev: true, Lib: failingInit(nvml.ERROR_LIBRARY_NOT_FOUND)},
		cards:     2,
		simulated: true,
		message:   "no NVIDIA driver found (libnvidia-ml.so.1): simulating 2 cards: l4=2",
	}, {
		name:      "dev with the driver library but no kernel module",
		opts:      Options{NodeName: "n1", Dev: true, Lib: failingInit(nvml.ERROR_DRIVER_NOT_LOADED)},
		cards:     2,
		simulated: true,
		message:   "no NVIDIA driver loaded (libnvidia-ml.so.1 is installed, the kernel module is not): simulating 2 cards: l4=2",
	}, {
		name:      "dev with a driver and no cards",
		opts:      Options{NodeName: "n1", Dev: true, Lib: noCards},
		cards:     2,
		simulated: true,
		message:   "NVML found no NVIDIA cards: simulating 2 cards: l4=2",
	}, {
		name: "a client node without a driver is an error",
		opts: Options{NodeName: "n1", Lib: failingInit(nvml.ERROR_LIBRARY_NOT_FOUND)},
		err:  "no NVIDIA driver found (libnvidia-ml.so.1); pass --sim-gpus to simulate cards, e.g. --sim-gpus l4=2",
	}, {
		name:    "a server without a driver runs with no cards",
		opts:    Options{NodeName: "n1", Server: true, Lib: failingInit(nvml.ERROR_LIBRARY_NOT_FOUND)},
		message: "no NVIDIA driver found (libnvidia-ml.so.1): running as a server with no cards (--sim-gpus simulates some)",
	}, {
		name:    "a server with the driver library but no kernel module runs with no cards",
		opts:    Options{NodeName: "n1", Server: true, Lib: failingInit(nvml.ERROR_DRIVER_NOT_LOADED)},
		message: "no NVIDIA driver loaded (libnvidia-ml.so.1 is installed, the kernel module is not): running as a server with no cards (--sim-gpus simulates some)",
	}, {
		name:      "a dev server without a driver still simulates l4=2",
		opts:      Options{NodeName: "n1", Dev: true, Server: true, Lib: failingInit(nvml.ERROR_LIBRARY_NOT_FOUND)},
		cards:     2,
		simulated: true,
		message:   "no NVIDIA driver found (libnvidia-ml.so.1): simulating 2 cards: l4=2",
	}, {
		name: "other NVML failures are errors, even in dev",
		opts: Options{NodeName: "n1", Dev: true, Lib: failingInit(nvml.ERROR_NO_PERMISSION)},
		err:  "read cards through NVML: initialise NVML: ERROR_NO_PERMISSION",
	}, {
		name:    "a driver and no cards outside dev",
		opts:    Options{NodeName: "n1", Lib: noCards},
		message: "found 0 NVIDIA cards through NVML",
	}, {
		name:    "real cards",
		opts:    Options{NodeName: "n1", Dev: true, Lib: dgxa100.New()},
		cards:   8,
		message: "found 8 NVIDIA cards through NVML: a100-40gb=8",
	}, {
		name: "bad sim spec",
		opts: Options{NodeName: "n1", SimSpec: "l4"},
		err:  `sim GPUs "l4": entry "l4" is not KIND=COUNT`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Detect(tt.opts)
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Cards) != tt.cards || res.Simulated != tt.simulated || res.Message != tt.message {
				t.Errorf("got %d cards, simulated %t, message %q; want %d, %t, %q",
					len(res.Cards), res.Simulated, res.Message, tt.cards, tt.simulated, tt.message)
			}
		})
	}
}

func TestDetectDevSimulatesTheSameCardsAsSimSpec(t *testing.T) {
	dev, err := Detect(Options{NodeName: "n1", Dev: true, Lib: failingInit(nvml.ERROR_LIBRARY_NOT_FOUND)})
	if err != nil {
		t.Fatal(err)
	}
	explicit, err := Simulated("n1", DefaultSimSpec)
	if err != nil {
		t.Fatal(err)
	}
	if Digest(dev.Cards) != Digest(explicit) {
		t.Errorf("--dev without a driver simulated %v, want the cards of --sim-gpus %s: %v", dev.Cards, DefaultSimSpec, explicit)
	}
}
