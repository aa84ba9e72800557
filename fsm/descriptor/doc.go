// Package descriptor parses gpuplane resource descriptors: the multi-document
// YAML files that `gpuplane apply`, `validate` and `delete -f` read (docs/descriptors.md).
//
// Parsing is strict and exhaustive. Every document is read into a YAML node
// tree first and walked against the typed Go structs' json tags
// (internal/strictyaml, the walker `simulate` and `simulate serve` configs
// share), so an unknown field, a key set twice or a value of the wrong type
// is reported with its full path
// (`spec.engine.memoryPercent: must be an integer, got "45%"`), and every
// problem in the file is reported, not only the first. What passed is then
// decoded into the typed structs (encoding/json applies the tags) and checked against
// the rules that need nothing but the file itself (docs/descriptors.md rules 1, 3, 4, 8, 9
// and 10 where the file names the accelerator).
//
// A document may also carry `status`, as `gpuplane get -o yaml` prints it
// (AcceleratorSpecFromProto, ModelDeploymentSpecFromProto give the spec
// beside it): output only, ignored by apply, so that what get prints can be
// applied back as kubectl allows.
//
// Three fields go beyond docs/descriptors.md and docs/residency.md: a deployment's optional
// `aliases: [helpdesk]`, other names for the same replicas (one resident
// copy of the weights, docs/descriptors.md rule 17), its optional
// `resources: {cpu: 500m, memory: 8Gi}` block, the host CPU and memory each
// replica needs besides its cards (see HostResources), and
// `engine.startTimeout: 10m`, how long one start of its engine may take to
// become ready (a whole number of seconds, at most MaxStartTimeout; left
// out, the engine kind's default from package engine applies).
//
// Memory quantities (`engine.memory`, `resources.memory`) are written the
// Kubernetes way: bytes, a binary suffix (20Gi = 20×2³⁰ bytes) or a decimal
// one (20G = 20×10⁹ bytes); they are kept in MiB, rounded up to a whole MiB
// so that a memory promise is never less than what was written (Quantity).
//
// The package is pure: bytes in, values and problems out. It never reads
// files, the network or the clock, so it can be fuzzed and shared by the CLI
// and the server. Checks that need cluster state (known device kinds,
// MAX/NODE, existing accelerators) belong to the server.
package descriptor
