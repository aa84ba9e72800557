// Package descriptor parses gpuplane resource descriptors: the multi-document
// YAML files that `gpuplane apply`, `validate` and `delete -f` read (SPEC §4).
//
// Parsing is strict and exhaustive. Every document is decoded into a generic
// tree first and walked against the typed Go structs' json tags, so an unknown
// field or a value of the wrong type is reported with its full path
// (`spec.engine.memoryPercent: must be an integer, got "45%"`), and every
// problem in the file is reported, not only the first. The walked tree is then
// converted into the typed structs with sigs.k8s.io/yaml and checked against
// the rules that need nothing but the file itself (SPEC §5 rules 1, 3, 4, 8, 9
// and 10 where the file names the accelerator).
//
// A document may also carry `status`, as `gpuplane get -o yaml` prints it
// (AcceleratorSpecFromProto, ModelDeploymentSpecFromProto give the spec
// beside it): output only, ignored by apply, so that what get prints can be
// applied back as kubectl allows.
//
// Three fields go beyond SPEC §4 and §8.1: a deployment's optional
// `aliases: [helpdesk]`, other names for the same replicas (one resident
// copy of the weights, descriptors.md rule 17), its optional
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
