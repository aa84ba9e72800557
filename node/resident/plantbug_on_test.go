//go:build residency_plantbug

package resident

// plantedBug: node/residency is built without its I3 guard.
const plantedBug = true
