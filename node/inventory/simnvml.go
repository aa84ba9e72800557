package inventory

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// EnvSimUsageDir names the environment variable through which the executor
// tells an engine on simulated cards where its SimUsage directory is.
const EnvSimUsageDir = "GPUPLANE_SIM_NVML_DIR"

// SimNVML is an nvml.Interface over simulated cards, built from go-nvml's
// mock types. It answers Init, Shutdown, DeviceGetCount,
// DeviceGetHandleByIndex and DeviceGetHandleByUUID; its devices answer
// GetName, GetUUID, GetIndex, GetMinorNumber, GetArchitecture, GetMemoryInfo
// and GetComputeRunningProcesses, the last two from a SimUsage. Any other
// call panics, as go-nvml's mocks do.
type SimNVML struct {
	mock.Interface
	devices []*mock.Device
	uuids   []string
}

// NewSimNVML serves cards (ordered by index) with the process usage recorded
// in usage; a nil usage reports no processes.
func NewSimNVML(cards []*pb.Card, usage *SimUsage) *SimNVML {
	sorted := slices.SortedFunc(slices.Values(cards), func(a, b *pb.Card) int {
		return cmp.Compare(a.GetIndex(), b.GetIndex())
	})
	s := &SimNVML{}
	for _, c := range sorted {
		s.devices = append(s.devices, simDevice(c, usage))
		s.uuids = append(s.uuids, c.GetUuid())
	}
	s.InitFunc = func() nvml.Return { return nvml.SUCCESS }
	s.ShutdownFunc = func() nvml.Return { return nvml.SUCCESS }
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return len(s.devices), nvml.SUCCESS }
	return s
}

// DeviceGetHandleByIndex returns the card at index. It bypasses the mock's
// call log, which records arguments and would grow as long as a watchdog polls.
func (s *SimNVML) DeviceGetHandleByIndex(index int) (nvml.Device, nvml.Return) {
	if index < 0 || index >= len(s.devices) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return s.devices[index], nvml.SUCCESS
}

// DeviceGetHandleByUUID returns the card with this UUID, bypassing the mock's
// call log like DeviceGetHandleByIndex.
func (s *SimNVML) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	if i := slices.Index(s.uuids, uuid); i >= 0 {
		return s.devices[i], nvml.SUCCESS
	}
	return nil, nvml.ERROR_NOT_FOUND
}

func simDevice(c *pb.Card, usage *SimUsage) *mock.Device {
	total := c.GetMemoryMib() * mib
	processes := func() ([]SimProcess, nvml.Return) {
		if usage == nil {
			return nil, nvml.SUCCESS
		}
		procs, err := usage.Processes(c.GetUuid())
		if err != nil {
			slog.Warn("read simulated GPU usage", "card", c.GetUuid(), "err", err)
			return nil, nvml.ERROR_UNKNOWN
		}
		return procs, nvml.SUCCESS
	}
	arch := nvml.DeviceArchitecture(nvml.DEVICE_ARCH_UNKNOWN)
	for code, name := range architectures {
		if name == c.GetArchitecture() {
			arch = code
		}
	}
	return &mock.Device{
		GetNameFunc:         func() (string, nvml.Return) { return c.GetProduct(), nvml.SUCCESS },
		GetUUIDFunc:         func() (string, nvml.Return) { return c.GetUuid(), nvml.SUCCESS },
		GetIndexFunc:        func() (int, nvml.Return) { return int(c.GetIndex()), nvml.SUCCESS },
		GetMinorNumberFunc:  func() (int, nvml.Return) { return int(c.GetIndex()), nvml.SUCCESS },
		GetArchitectureFunc: func() (nvml.DeviceArchitecture, nvml.Return) { return arch, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			procs, ret := processes()
			if ret != nvml.SUCCESS {
				return nvml.Memory{}, ret
			}
			var used uint64
			for _, p := range procs {
				used += p.UsedMiB * mib
			}
			return nvml.Memory{Total: total, Used: used, Free: total - min(used, total)}, nvml.SUCCESS
		},
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			procs, ret := processes()
			infos := make([]nvml.ProcessInfo, len(procs))
			for i, p := range procs {
				// No MIG: NVML reports the instance ids as invalid.
				infos[i] = nvml.ProcessInfo{Pid: uint32(p.PID), UsedGpuMemory: p.UsedMiB * mib,
					GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
			}
			return infos, ret
		},
	}
}

// SimUsage records the GPU memory that processes use on simulated cards, as
// <dir>/<card UUID>/<pid> files holding MiB, so that an engine process can
// register itself and the agent's watchdog, another process, can read it.
// Files of processes that are gone are ignored and removed.
type SimUsage struct {
	dir string
}

// SimProcess is one process's usage of one simulated card.
type SimProcess struct {
	PID     int
	UsedMiB uint64
}

// NewSimUsage uses dir, which is created on the first Register.
func NewSimUsage(dir string) *SimUsage {
	return &SimUsage{dir: dir}
}

// Register records that process pid uses usedMiB of card cardUUID, replacing
// what it recorded before. Readers never see a partly written file.
func (u *SimUsage) Register(cardUUID string, pid int, usedMiB uint64) error {
	dir, err := u.cardDir(cardUUID)
	if err != nil {
		return err
	}
	if pid <= 0 {
		return fmt.Errorf("register usage of %s: invalid pid %d", cardUUID, pid)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("register usage of %s: %w", cardUUID, err)
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("register usage of %s: %w", cardUUID, err)
	}
	_, err = fmt.Fprintf(tmp, "%d\n", usedMiB)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, strconv.Itoa(pid)))
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("register usage of %s by pid %d: %w", cardUUID, pid, err)
	}
	return nil
}

// Unregister forgets process pid's usage of card cardUUID; forgetting what
// was never recorded is not an error.
func (u *SimUsage) Unregister(cardUUID string, pid int) error {
	dir, err := u.cardDir(cardUUID)
	if err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, strconv.Itoa(pid))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("unregister usage of %s by pid %d: %w", cardUUID, pid, err)
	}
	return nil
}

// Processes returns the live processes using card cardUUID, by pid.
func (u *SimUsage) Processes(cardUUID string) ([]SimProcess, error) {
	dir, err := u.cardDir(cardUUID)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read usage of %s: %w", cardUUID, err)
	}
	var procs []SimProcess
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue // a temporary file being written
		}
		path := filepath.Join(dir, e.Name())
		if !alive(pid) {
			// Removing it keeps a later process with the same pid from
			// inheriting its usage.
			_ = os.Remove(path)
			continue
		}
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // unregistered meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("read usage of %s: %w", cardUUID, err)
		}
		used, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("read usage of %s by pid %d: %q is not a number of MiB", cardUUID, pid, data)
		}
		procs = append(procs, SimProcess{PID: pid, UsedMiB: used})
	}
	slices.SortFunc(procs, func(a, b SimProcess) int { return cmp.Compare(a.PID, b.PID) })
	return procs, nil
}

// cardDir is the directory of one card, refusing UUIDs that would escape dir.
func (u *SimUsage) cardDir(cardUUID string) (string, error) {
	if cardUUID == "" || cardUUID == "." || cardUUID == ".." || strings.ContainsAny(cardUUID, `/\`) {
		return "", fmt.Errorf("invalid card UUID %q", cardUUID)
	}
	return filepath.Join(u.dir, cardUUID), nil
}

// alive reports whether process pid exists; EPERM means it does, owned by
// another user.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// engineDir is where, inside a card's directory, sim engines keep their
// records. Its name is not a pid, so Processes skips it.
const engineDir = ".engines"

// SimEngine is what one sim engine process tells the other sim engines on
// the same simulated card, so that separate processes can share the card's
// compute and copy bandwidth as they would on a real card.
type SimEngine struct {
	PID   int    `json:"pid"`
	Model string `json:"model"`
	// ComputeWeight is the engine's compute share in percent; busy engines
	// split the card's compute in proportion to it.
	ComputeWeight uint32 `json:"computeWeight"`
	// Busy says the engine has requests in flight.
	Busy bool `json:"busy"`
	// Copying says the engine is moving weights onto the card (a load or a
	// wake): copies in progress split the card's copy bandwidth.
	Copying bool `json:"copying"`
	// State is the engine's residency state (loading, awake, asleep, ...).
	State string `json:"state"`
	// HostMiB is host RAM the engine holds: its weights while it sleeps
	// (level 1), and llama-server's host-RAM prompt cache (--cache-ram).
	HostMiB uint64 `json:"hostMiB"`
}

// SetEngine records e as the state of engine e.PID on card cardUUID,
// replacing its previous record. Each engine writes only its own record and
// readers never see a partly written one, so no lock is needed.
func (u *SimUsage) SetEngine(cardUUID string, e SimEngine) error {
	dir, err := u.cardDir(cardUUID)
	if err != nil {
		return err
	}
	if e.PID <= 0 {
		return fmt.Errorf("record sim engine on %s: invalid pid %d", cardUUID, e.PID)
	}
	data, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, engineDir), strconv.Itoa(e.PID)+".json", data); err != nil {
		return fmt.Errorf("record sim engine %d on %s: %w", e.PID, cardUUID, err)
	}
	return nil
}

// RemoveEngine forgets engine pid's record on card cardUUID.
func (u *SimUsage) RemoveEngine(cardUUID string, pid int) error {
	dir, err := u.cardDir(cardUUID)
	if err != nil {
		return err
	}
	err = os.Remove(filepath.Join(dir, engineDir, strconv.Itoa(pid)+".json"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("forget sim engine %d on %s: %w", pid, cardUUID, err)
	}
	return nil
}

// Engines returns the records of the live sim engines on card cardUUID, by
// pid; records of processes that are gone are removed.
func (u *SimUsage) Engines(cardUUID string) ([]SimEngine, error) {
	dir, err := u.cardDir(cardUUID)
	if err != nil {
		return nil, err
	}
	dir = filepath.Join(dir, engineDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read sim engines of %s: %w", cardUUID, err)
	}
	var out []SimEngine
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		pid, err := strconv.Atoi(name)
		if !ok || err != nil || pid <= 0 {
			continue // a temporary file being written
		}
		path := filepath.Join(dir, e.Name())
		if !alive(pid) {
			_ = os.Remove(path)
			continue
		}
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read sim engines of %s: %w", cardUUID, err)
		}
		var rec SimEngine
		if err := json.Unmarshal(data, &rec); err != nil {
			return nil, fmt.Errorf("read sim engine %d of %s: %w", pid, cardUUID, err)
		}
		rec.PID = pid
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b SimEngine) int { return cmp.Compare(a.PID, b.PID) })
	return out, nil
}

// writeAtomic writes data to dir/name through a temporary file and a
// rename, creating dir.
func writeAtomic(dir, name string, data []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
	}
	return err
}
