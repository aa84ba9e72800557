package engine

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Mode says how a node holds engines to their shares beyond the engines' own
// flags (--enforce).
type Mode string

// Enforcement modes.
const (
	// ModeAuto picks MPS when a control daemon runs, else HAMi-core when a
	// library is configured, else none.
	ModeAuto Mode = "auto"
	// ModeMPS sets CUDA MPS's per-client pinned memory and thread limits.
	ModeMPS Mode = "mps"
	// ModeHAMi preloads HAMi-core's libvgpu.so with its memory and SM limits.
	ModeHAMi Mode = "hami"
	// ModeNone relies on the engines' flags and the watchdog alone.
	ModeNone Mode = "none"
)

// Modes lists the values --enforce accepts.
var Modes = []Mode{ModeAuto, ModeMPS, ModeHAMi, ModeNone}

// ParseMode parses an --enforce value.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if strings.EqualFold(s, string(m)) {
			return m, nil
		}
	}
	return "", fmt.Errorf("invalid enforcement mode %q: want auto, mps, hami or none", s)
}

// DefaultMPSPipeDir is where the MPS control daemon listens unless
// CUDA_MPS_PIPE_DIRECTORY says otherwise.
const DefaultMPSPipeDir = "/tmp/nvidia-mps"

// Enforcement is a resolved mode (never auto) with what it needs.
type Enforcement struct {
	Mode Mode
	// MPSPipeDir is the MPS control daemon's pipe directory (mps).
	MPSPipeDir string
	// HAMiLib is the path of HAMi-core's libvgpu.so (hami).
	HAMiLib string
}

// DetectOptions is what Detect looks at.
type DetectOptions struct {
	// HAMiLib is --hami-lib.
	HAMiLib string
	// Getenv reads the agent's environment (CUDA_MPS_PIPE_DIRECTORY); nil
	// means os.Getenv.
	Getenv func(string) string
}

// Detect resolves mode on this node and returns a sentence saying what it
// chose and why, for the agent to print. Asking for mps without a running
// control daemon, or hami without a library, is an error.
func Detect(mode Mode, opts DetectOptions) (Enforcement, string, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	pipeDir := getenv("CUDA_MPS_PIPE_DIRECTORY")
	if pipeDir == "" {
		pipeDir = DefaultMPSPipeDir
	}
	control := filepath.Join(pipeDir, "control")
	mps := isSocket(control)
	hamiErr := checkLib(opts.HAMiLib)
	switch mode {
	case ModeMPS:
		if !mps {
			return Enforcement{}, "", fmt.Errorf("--enforce mps: no MPS control daemon at %s (start nvidia-cuda-mps-control -d or set CUDA_MPS_PIPE_DIRECTORY)", control)
		}
		return Enforcement{Mode: ModeMPS, MPSPipeDir: pipeDir},
			fmt.Sprintf("enforcing shares with CUDA MPS (control daemon at %s, --enforce mps)", control), nil
	case ModeHAMi:
		if hamiErr != nil {
			return Enforcement{}, "", fmt.Errorf("--enforce hami: %w", hamiErr)
		}
		return Enforcement{Mode: ModeHAMi, HAMiLib: opts.HAMiLib},
			fmt.Sprintf("enforcing shares with HAMi-core (%s, --enforce hami)", opts.HAMiLib), nil
	case ModeNone:
		return Enforcement{Mode: ModeNone}, "not enforcing hard limits (--enforce none): shares are held by engine flags and the memory watchdog", nil
	case ModeAuto, "":
	default:
		return Enforcement{}, "", fmt.Errorf("invalid enforcement mode %q: want auto, mps, hami or none", mode)
	}
	switch {
	case mps:
		return Enforcement{Mode: ModeMPS, MPSPipeDir: pipeDir},
			fmt.Sprintf("enforcing shares with CUDA MPS: found its control daemon at %s", control), nil
	case opts.HAMiLib != "" && hamiErr == nil:
		return Enforcement{Mode: ModeHAMi, HAMiLib: opts.HAMiLib},
			fmt.Sprintf("enforcing shares with HAMi-core: %s (no MPS control daemon at %s)", opts.HAMiLib, control), nil
	case opts.HAMiLib != "":
		return Enforcement{Mode: ModeNone},
			fmt.Sprintf("not enforcing hard limits: no MPS control daemon at %s and %v; shares are held by engine flags and the memory watchdog", control, hamiErr), nil
	}
	return Enforcement{Mode: ModeNone},
		fmt.Sprintf("not enforcing hard limits: no MPS control daemon at %s and no --hami-lib; shares are held by engine flags and the memory watchdog", control), nil
}

func isSocket(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().Type() == fs.ModeSocket
}

func checkLib(path string) error {
	if path == "" {
		return fmt.Errorf("no HAMi-core library: pass --hami-lib PATH (libvgpu.so)")
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("HAMi-core library: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("HAMi-core library %s is not a file", path)
	}
	return nil
}

// Env is the environment that holds a replica to its share under e.
// Memory limits are per card (replica memory_mib); the compute share, when
// the deployment sets one, limits the SMs or MPS threads.
func (e Enforcement) Env(p Params) []string {
	mem := p.Replica.GetMemoryMib()
	compute := p.Replica.GetComputePercent()
	var env []string
	switch e.Mode {
	case ModeMPS:
		env = append(env, "CUDA_MPS_PIPE_DIRECTORY="+e.MPSPipeDir)
		if mem > 0 {
			limits := make([]string, len(p.Cards))
			for i := range p.Cards {
				// Ordinals as the client sees them, after CUDA_VISIBLE_DEVICES.
				limits[i] = fmt.Sprintf("%d=%dMB", i, mem)
			}
			env = append(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="+strings.Join(limits, ","))
		}
		if compute > 0 {
			env = append(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+u32(compute))
		}
	case ModeHAMi:
		env = append(env, "LD_PRELOAD="+e.HAMiLib)
		if mem > 0 {
			env = append(env, fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT=%dm", mem))
		}
		if compute > 0 {
			env = append(env, "CUDA_DEVICE_SM_LIMIT="+u32(compute))
		}
	}
	return env
}
