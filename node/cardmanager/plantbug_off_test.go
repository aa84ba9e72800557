//go:build !residency_plantbug

package cardmanager

const plantedBug = false
