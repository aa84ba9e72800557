// Package simulate holds the example cluster and workload in this folder,
// embedded so that `gpuplane simulate` runs them when it is given no files
// and finds no openb trace: the command works from a fresh clone and from an
// installed binary alike.
package simulate

import _ "embed"

// Nodes is nodes.yaml: the example cluster.
//
//go:embed nodes.yaml
var Nodes []byte

// Workload is workload.yaml: the example accelerators and arrivals.
//
//go:embed workload.yaml
var Workload []byte

// The names the example's files go by in messages.
const (
	NodesFile    = "examples/simulate/nodes.yaml"
	WorkloadFile = "examples/simulate/workload.yaml"
)
