//go:build jepsenbug

package fsm

// skipCapacityCheck disables the capacity re-check of placements. It exists
// only in binaries built with -tags jepsenbug, for the jepsen test that
// proves the over-commit checker can fail. Never build a release with it.
const skipCapacityCheck = true
