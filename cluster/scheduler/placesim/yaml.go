package placesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
	"github.com/gpuplane/gpuplane/internal/cardfit"
)

// The YAML forms, parsed strictly: an unknown field is an error.
//
// Nodes file:
//
//	nodes:
//	- name: gpu-a          # with count, names become gpu-a-0, gpu-a-1, ...
//	  count: 4             # optional, default 1
//	  labels: {zone: a}    # optional
//	  cards: {l4: 2}       # kind → number of cards, or a list:
//	  # cards: [{device: l4, memoryMiB: 23034}, {device: t4, unhealthy: true}]
//	  cpuMilli: 64000      # optional host capacity, 0 = not tracked
//	  memoryMiB: 262144    # optional
//	  down: false          # optional: the node is not alive
//
// Workload file (accelerator fields as in docs/descriptors.md):
//
//	accelerators:
//	- {name: small, device: l4, tenancy: shared, maxModels: 2}
//	- {name: big, device: h100, devicesPerReplica: 2}   # tenancy dedicated
//	arrivals:              # placed in this order, replicas one by one
//	- {deployment: chat, accelerator: small, replicas: 3, memoryPercent: 45}
//	- {deployment: llm, accelerator: big, replicas: 1, cpuMilli: 8000, selector: {zone: a}}
//	- {deployment: asr, accelerator: small, memoryPercent: 60, residency: onDemand}
//
// residency is pinned (default), warm or onDemand (docs/residency.md; warm and
// onDemand need a shared accelerator).
//
// Replica ids are the deployment name and a counter: chat-0, chat-1, ...

type nodesFile struct {
	Nodes []nodeSpec `json:"nodes"`
}

type nodeSpec struct {
	Name      string            `json:"name"`
	Count     int               `json:"count,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Cards     cardsSpec         `json:"cards"`
	CPUMilli  int64             `json:"cpuMilli,omitempty"`
	MemoryMiB int64             `json:"memoryMiB,omitempty"`
	Down      bool              `json:"down,omitempty"`
}

type cardSpec struct {
	Device    string `json:"device"`
	MemoryMiB int64  `json:"memoryMiB,omitempty"`
	Unhealthy bool   `json:"unhealthy,omitempty"`
}

// cardsSpec accepts a map of kind → count or a list of cards.
type cardsSpec []cardSpec

func (c *cardsSpec) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '{' {
		var m map[string]int
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("cards: want a map of device kind to count: %w", err)
		}
		kinds := make([]string, 0, len(m))
		for k := range m {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		for _, k := range kinds {
			if m[k] < 0 {
				return fmt.Errorf("cards: %s: negative count %d", k, m[k])
			}
			for i := 0; i < m[k]; i++ {
				*c = append(*c, cardSpec{Device: k})
			}
		}
		return nil
	}
	var list []cardSpec
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&list); err != nil {
		return fmt.Errorf("cards: want a map of device kind to count or a list: %w", err)
	}
	*c = list
	return nil
}

// ParseNodesYAML parses a nodes file.
func ParseNodesYAML(name string, data []byte) ([]scheduler.Node, error) {
	var f nodesFile
	if err := decodeYAML(name, data, &f); err != nil {
		return nil, err
	}
	var nodes []scheduler.Node
	seen := map[string]bool{}
	for i, ns := range f.Nodes {
		if ns.Name == "" {
			return nil, fmt.Errorf("%s: nodes[%d]: name is required", name, i)
		}
		if ns.Count < 0 {
			return nil, fmt.Errorf("%s: nodes[%d] %s: negative count", name, i, ns.Name)
		}
		names := []string{ns.Name}
		if ns.Count > 0 {
			names = names[:0]
			for k := 0; k < ns.Count; k++ {
				names = append(names, fmt.Sprintf("%s-%d", ns.Name, k))
			}
		}
		for _, nm := range names {
			if seen[nm] {
				return nil, fmt.Errorf("%s: node %s defined twice", name, nm)
			}
			seen[nm] = true
			n := scheduler.Node{Name: nm, Alive: !ns.Down, Labels: ns.Labels,
				CPUMilli: ns.CPUMilli, MemoryMiB: ns.MemoryMiB}
			for ci, cs := range ns.Cards {
				if cs.Device == "" {
					return nil, fmt.Errorf("%s: node %s card %d: device is required", name, nm, ci)
				}
				n.Cards = append(n.Cards, scheduler.Card{Index: ci, Device: strings.ToLower(cs.Device),
					MemoryMiB: cs.MemoryMiB, Healthy: !cs.Unhealthy})
			}
			nodes = append(nodes, n)
		}
	}
	return nodes, nil
}

type workloadFile struct {
	Accelerators []acceleratorSpec `json:"accelerators"`
	Arrivals     []arrivalSpec     `json:"arrivals"`
}

type acceleratorSpec struct {
	Name              string `json:"name"`
	Device            string `json:"device"`
	Tenancy           string `json:"tenancy,omitempty"`
	MaxModels         *int   `json:"maxModels,omitempty"`
	DevicesPerReplica *int   `json:"devicesPerReplica,omitempty"`
}

type arrivalSpec struct {
	Deployment    string            `json:"deployment"`
	Accelerator   string            `json:"accelerator"`
	Replicas      *int              `json:"replicas,omitempty"`
	MemoryPercent int               `json:"memoryPercent,omitempty"`
	CPUMilli      int64             `json:"cpuMilli,omitempty"`
	MemoryMiB     int64             `json:"memoryMiB,omitempty"`
	Selector      map[string]string `json:"selector,omitempty"`
	Residency     string            `json:"residency,omitempty"`
}

// ParseWorkloadYAML parses a workload file into accelerators and arrivals,
// applying docs/descriptors.md's defaults (tenancy dedicated, maxModels 2,
// devicesPerReplica 1) and rules 3, 4 and 8.
func ParseWorkloadYAML(name string, data []byte) ([]scheduler.Accelerator, []scheduler.Request, error) {
	var f workloadFile
	if err := decodeYAML(name, data, &f); err != nil {
		return nil, nil, err
	}
	accs := make([]scheduler.Accelerator, 0, len(f.Accelerators))
	byName := map[string]scheduler.Accelerator{}
	for i, as := range f.Accelerators {
		a, err := as.accelerator()
		if err != nil {
			return nil, nil, fmt.Errorf("%s: accelerators[%d]: %w", name, i, err)
		}
		if _, dup := byName[a.Name]; dup {
			return nil, nil, fmt.Errorf("%s: accelerator %s defined twice", name, a.Name)
		}
		byName[a.Name] = a
		accs = append(accs, a)
	}
	var reqs []scheduler.Request
	next := map[string]int{}
	for i, ar := range f.Arrivals {
		where := fmt.Sprintf("%s: arrivals[%d]", name, i)
		if ar.Deployment == "" {
			return nil, nil, fmt.Errorf("%s: deployment is required", where)
		}
		a, ok := byName[ar.Accelerator]
		if !ok {
			return nil, nil, fmt.Errorf("%s: deployment %s names unknown accelerator %q", where, ar.Deployment, ar.Accelerator)
		}
		n := 1
		if ar.Replicas != nil {
			n = *ar.Replicas
		}
		if n < 0 {
			return nil, nil, fmt.Errorf("%s: deployment %s: negative replicas", where, ar.Deployment)
		}
		if ar.CPUMilli < 0 || ar.MemoryMiB < 0 {
			return nil, nil, fmt.Errorf("%s: deployment %s: negative host request", where, ar.Deployment)
		}
		res, ok := cardfit.ParseResidency(ar.Residency)
		if !ok {
			return nil, nil, fmt.Errorf("%s: deployment %s: residency must be pinned, warm or onDemand, got %q", where, ar.Deployment, ar.Residency)
		}
		if res != scheduler.Pinned && a.Tenancy != scheduler.Shared {
			return nil, nil, fmt.Errorf("%s: deployment %s: an onDemand or warm deployment needs a shared accelerator, %s is dedicated", where, ar.Deployment, a.Name)
		}
		milli := 0
		if a.Tenancy == scheduler.Shared {
			if ar.MemoryPercent < 1 || ar.MemoryPercent > 100 {
				return nil, nil, fmt.Errorf("%s: deployment %s on shared accelerator %s needs memoryPercent 1..100, got %d",
					where, ar.Deployment, a.Name, ar.MemoryPercent)
			}
			milli = ar.MemoryPercent * 10
		}
		for k := 0; k < n; k++ {
			reqs = append(reqs, scheduler.Request{
				Replica:    fmt.Sprintf("%s-%d", ar.Deployment, next[ar.Deployment]),
				Deployment: ar.Deployment, Accelerator: a.Name, Milli: milli,
				CPUMilli: ar.CPUMilli, MemoryMiB: ar.MemoryMiB, Selector: ar.Selector, Residency: res,
			})
			next[ar.Deployment]++
		}
	}
	return accs, reqs, nil
}

func (as acceleratorSpec) accelerator() (scheduler.Accelerator, error) {
	a := scheduler.Accelerator{Name: as.Name, Device: strings.ToLower(as.Device)}
	if a.Name == "" {
		return a, fmt.Errorf("name is required")
	}
	if a.Device == "" {
		return a, fmt.Errorf("accelerator %s: device is required", a.Name)
	}
	switch as.Tenancy {
	case "", "dedicated":
		a.Tenancy = scheduler.Dedicated
		if as.MaxModels != nil {
			return a, fmt.Errorf("accelerator %s: maxModels is for shared accelerators only", a.Name)
		}
		a.DevicesPerReplica = 1
		if as.DevicesPerReplica != nil {
			if *as.DevicesPerReplica < 1 {
				return a, fmt.Errorf("accelerator %s: devicesPerReplica must be at least 1", a.Name)
			}
			a.DevicesPerReplica = *as.DevicesPerReplica
		}
	case "shared":
		a.Tenancy = scheduler.Shared
		if as.DevicesPerReplica != nil && *as.DevicesPerReplica > 1 {
			return a, fmt.Errorf("accelerator %s: a shared accelerator splits a single device (devicesPerReplica %d)",
				a.Name, *as.DevicesPerReplica)
		}
		a.MaxModels = 2
		if as.MaxModels != nil {
			if *as.MaxModels < 1 {
				return a, fmt.Errorf("accelerator %s: maxModels must be at least 1", a.Name)
			}
			a.MaxModels = *as.MaxModels
		}
	default:
		return a, fmt.Errorf("accelerator %s: tenancy %q: want dedicated or shared", a.Name, as.Tenancy)
	}
	return a, nil
}
