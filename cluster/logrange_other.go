//go:build !linux

package cluster

// offlineMmapFlags: see logrange_linux.go; elsewhere bbolt's defaults.
const offlineMmapFlags = 0
