//go:build !residency_plantbug

package resident

const plantedBug = false
