// Package inventory reads the local machine's cards: from NVML through
// go-nvml when an NVIDIA driver is present, or simulated from a spec such as
// "l4=2,h100=1" when there is none (docs/operations.md, --sim-gpus and --dev).
//
// It owns what this node has, never what the cluster knows: it never writes to
// the cluster. The agent calls Detect once at start, prints Result.Message and
// registers Result.Cards with the state machine; Digest lets gossip notice when
// a node's inventory changed.
//
// Card slugs come from the built-in catalog (fsm/catalog), keyed by the NVML
// product name. Simulated cards have UUIDs derived from the node name, index
// and kind, so a restarted node reports the same cards.
//
// SimNVML is an nvml.Interface over simulated cards, so that the executor's
// watchdog reads GPU memory per process the same way on simulated and real
// cards. Engines on simulated cards report their usage through SimUsage, a
// directory of small files that separate processes can write. Sim engines
// also keep a record each there (SimEngine: busy, copying, compute share,
// host RAM), through which separate engine processes on one card share its
// compute and copy bandwidth.
//
// Card indexes are NVML's (PCI bus order), which may differ from CUDA's
// default enumeration; consumers should address cards by UUID.
package inventory
