//go:build residency_plantbug

package cardmanager

// plantedBug: node/residency is built without its I3 guard.
const plantedBug = true
