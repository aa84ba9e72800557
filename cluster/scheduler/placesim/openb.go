package placesim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
)

// The openb trace has no accelerators; its tasks are mapped onto these.
const (
	// OpenBShared takes the tasks that ask for part of one card: shared, on
	// any device kind, with no maxModels bound, as in the trace's cluster.
	OpenBShared = "openb-share"
	// OpenBWholePrefix + k names the dedicated accelerator of tasks that ask
	// for k whole cards on one node ("openb-gpu-2").
	OpenBWholePrefix = "openb-gpu-"
)

// OpenB file names inside the trace folder.
const (
	OpenBNodesFile = "openb_node_list_gpu_node.csv"
	OpenBTasksFile = "openb_pod_list_default.csv"
)

// OpenBDir finds the openb trace folder: $GPUPLANE_OPENB_DIR, else
// shared/data/openb in the working directory or one of its parents (the
// repository sits next to shared/, so ../shared/data/openb from its root).
// It returns "" when the trace is absent.
func OpenBDir() string {
	if d := os.Getenv("GPUPLANE_OPENB_DIR"); d != "" {
		if isOpenBDir(d) {
			return d
		}
		return ""
	}
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if d := filepath.Join(dir, "shared", "data", "openb"); isOpenBDir(d) {
			return d
		}
		if filepath.Dir(dir) == dir {
			return ""
		}
	}
}

func isOpenBDir(d string) bool {
	for _, f := range []string{OpenBNodesFile, OpenBTasksFile} {
		if st, err := os.Stat(filepath.Join(d, f)); err != nil || st.IsDir() {
			return false
		}
	}
	return true
}

// LoadOpenB reads the trace's two CSV files from dir.
func LoadOpenB(dir string) (*Scenario, error) {
	return Load(filepath.Join(dir, OpenBNodesFile), filepath.Join(dir, OpenBTasksFile))
}

// csvTable reads a CSV with a header and returns a column lookup.
type csvTable struct {
	name string
	col  map[string]int
	rows [][]string
}

func readCSV(name string, r io.Reader, want ...string) (*csvTable, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	recs, err := cr.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%s: empty file, want a header with %s", name, strings.Join(want, ","))
	}
	t := &csvTable{name: name, col: map[string]int{}, rows: recs[1:]}
	for i, h := range recs[0] {
		t.col[strings.TrimSpace(h)] = i
	}
	for _, w := range want {
		if _, ok := t.col[w]; !ok {
			return nil, fmt.Errorf("%s: header lacks column %q", name, w)
		}
	}
	return t, nil
}

func (t *csvTable) str(row int, col string) string {
	r := t.rows[row]
	if i := t.col[col]; i < len(r) {
		return strings.TrimSpace(r[i])
	}
	return ""
}

func (t *csvTable) int(row int, col string) (int64, error) {
	s := t.str(row, col)
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s line %d: column %s: %w", t.name, row+2, col, err)
	}
	if v < 0 {
		return 0, fmt.Errorf("%s line %d: column %s is negative (%d)", t.name, row+2, col, v)
	}
	return v, nil
}

// ReadOpenBNodes reads the openb nodes CSV (sn,cpu_milli,memory_mib,gpu,model).
// Device kinds are the lowercased model names ("V100M16" → "v100m16").
func ReadOpenBNodes(name string, r io.Reader) ([]scheduler.Node, error) {
	t, err := readCSV(name, r, "sn", "cpu_milli", "memory_mib", "gpu", "model")
	if err != nil {
		return nil, err
	}
	nodes := make([]scheduler.Node, 0, len(t.rows))
	for i := range t.rows {
		var v [3]int64
		for j, c := range []string{"cpu_milli", "memory_mib", "gpu"} {
			if v[j], err = t.int(i, c); err != nil {
				return nil, err
			}
		}
		n := scheduler.Node{Name: t.str(i, "sn"), Alive: true, CPUMilli: v[0], MemoryMiB: v[1]}
		if n.Name == "" {
			return nil, fmt.Errorf("%s line %d: empty sn", name, i+2)
		}
		kind := strings.ToLower(t.str(i, "model"))
		if v[2] > 0 && kind == "" {
			return nil, fmt.Errorf("%s line %d: node %s has %d GPUs but no model", name, i+2, n.Name, v[2])
		}
		for c := 0; c < int(v[2]); c++ {
			n.Cards = append(n.Cards, scheduler.Card{Index: c, Device: kind, Healthy: true})
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// The openb pod list schemas: the full header of most lists, and the
// short one of the multigpu* lists (no GPU-type restriction and no times,
// so arrival order is file order).
var (
	openbTasksLong  = []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time"}
	openbTasksShort = []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}
)

// clusterFacts is what a pod list is checked against: the most cards on
// one node and the device kinds present. nil skips those checks.
type clusterFacts struct {
	maxCards int
	kinds    map[string]bool
}

func factsOf(nodes []scheduler.Node) *clusterFacts {
	f := &clusterFacts{kinds: map[string]bool{}}
	for _, n := range nodes {
		f.maxCards = max(f.maxCards, len(n.Cards))
		for _, c := range n.Cards {
			f.kinds[strings.ToLower(c.Device)] = true
		}
	}
	return f
}

// ReadOpenBTasks reads an openb pod list (either schema) and returns its
// arrivals in creation_time order (file order among equals, and file order
// for the short schema) with the accelerators they use. A task with num_gpu
// 1 and gpu_milli below 1000 asks for that share of one card (OpenBShared);
// one with num_gpu ≥ 1 otherwise asks for num_gpu whole cards on one node;
// one with num_gpu 0 asks only for host CPU and memory. gpu_spec
// ("V100M16|V100M32") restricts device kinds. The first bad value is an
// error that names the file, line and column.
func ReadOpenBTasks(name string, r io.Reader) ([]scheduler.Accelerator, []scheduler.Request, error) {
	return readOpenBTasks(name, r, nil)
}

// cell is one field of a pod list with its place in the file.
type cell struct {
	name      string // file
	line, col int    // 1-based; col counts fields
	column    string // header name
}

func (c cell) errorf(format string, args ...any) error {
	return fmt.Errorf("%s line %d column %d (%s): %s", c.name, c.line, c.col, c.column, fmt.Sprintf(format, args...))
}

func sameHeader(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if strings.TrimSpace(got[i]) != want[i] {
			return false
		}
	}
	return true
}

func readOpenBTasks(name string, r io.Reader, facts *clusterFacts) ([]scheduler.Accelerator, []scheduler.Request, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	header, err := cr.Read()
	if err == io.EOF {
		return nil, nil, fmt.Errorf("%s: empty file, want an openb pod list header (%s)", name, strings.Join(openbTasksShort, ","))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(header) > 0 {
		header[0] = strings.TrimPrefix(header[0], "\ufeff")
	}
	var long bool
	switch {
	case sameHeader(header, openbTasksLong):
		long = true
	case sameHeader(header, openbTasksShort):
	default:
		return nil, nil, fmt.Errorf("%s line 1: header %q is not an openb pod list: want %q or %q",
			name, strings.Join(header, ","), strings.Join(openbTasksLong, ","), strings.Join(openbTasksShort, ","))
	}
	cols := openbTasksShort
	if long {
		cols = openbTasksLong
	}
	type task struct {
		req     scheduler.Request
		created int64
	}
	var tasks []task
	whole := map[int]bool{}
	shared := false
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", name, err)
		}
		line, _ := cr.FieldPos(0)
		at := func(i int) cell { return cell{name: name, line: line, col: i + 1, column: cols[i]} }
		if len(rec) != len(cols) {
			return nil, nil, fmt.Errorf("%s line %d: %d fields, want %d (%s)", name, line, len(rec), len(cols), strings.Join(cols, ","))
		}
		num := func(i int) (int64, error) {
			s := strings.TrimSpace(rec[i])
			if s == "" {
				return 0, nil
			}
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return 0, at(i).errorf("%q is not a whole number", s)
			}
			if v < 0 {
				return 0, at(i).errorf("%d is negative", v)
			}
			return v, nil
		}
		var v [5]int64
		for j, i := range []int{1, 2, 3, 4} {
			if v[j], err = num(i); err != nil {
				return nil, nil, err
			}
		}
		if long {
			if v[4], err = num(8); err != nil {
				return nil, nil, err
			}
		}
		id := strings.TrimSpace(rec[0])
		if id == "" {
			return nil, nil, at(0).errorf("empty task name")
		}
		req := scheduler.Request{Replica: id, Deployment: id, CPUMilli: v[0], MemoryMiB: v[1]}
		numGPU, milli := v[2], v[3]
		switch {
		case milli > scheduler.FullCard:
			return nil, nil, at(4).errorf("%d milli is more than one card (1000); a task asks for num_gpu cards of at most 1000 milli each", milli)
		case facts != nil && numGPU > int64(facts.maxCards):
			return nil, nil, at(3).errorf("%d cards on one node, but no node has more than %d", numGPU, facts.maxCards)
		case numGPU == 0:
		case numGPU == 1 && milli > 0 && milli < scheduler.FullCard:
			req.Accelerator, req.Milli = OpenBShared, int(milli)
			shared = true
		default:
			req.Accelerator = OpenBWholePrefix + strconv.FormatInt(numGPU, 10)
			whole[int(numGPU)] = true
		}
		if long {
			spec := strings.TrimSpace(rec[5])
			if strings.EqualFold(spec, "nan") {
				spec = "" // pandas' rendering of "no restriction"
			}
			if spec != "" && numGPU > 0 {
				for _, d := range strings.Split(spec, "|") {
					d = strings.ToLower(strings.TrimSpace(d))
					if d == "" {
						continue
					}
					if facts != nil && !facts.kinds[d] {
						return nil, nil, at(5).errorf("GPU type %q is not a model of any node (have %s)", d, strings.Join(sortedKeys(facts.kinds), ", "))
					}
					req.Devices = append(req.Devices, d)
				}
			}
		}
		tasks = append(tasks, task{req: req, created: v[4]})
	}
	sort.SliceStable(tasks, func(i, j int) bool { return tasks[i].created < tasks[j].created })
	reqs := make([]scheduler.Request, len(tasks))
	for i, tk := range tasks {
		reqs[i] = tk.req
	}
	var accs []scheduler.Accelerator
	if shared {
		accs = append(accs, scheduler.Accelerator{Name: OpenBShared, Tenancy: scheduler.Shared})
	}
	ks := make([]int, 0, len(whole))
	for k := range whole {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	for _, k := range ks {
		accs = append(accs, scheduler.Accelerator{Name: OpenBWholePrefix + strconv.Itoa(k),
			Tenancy: scheduler.Dedicated, DevicesPerReplica: k})
	}
	return accs, reqs, nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var errFormat = errors.New("unknown file format: want .csv (openb) or .yaml/.yml")
