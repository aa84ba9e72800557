//go:build !residency_plantbug

package residency_test

const plantedBug = false
