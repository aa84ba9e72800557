//go:build !jepsenbug

package fsm

// skipCapacityCheck is false in every real build. The jepsen harness builds a
// binary with -tags jepsenbug, where it is true (plantbug_jepsen.go), only to
// prove that its rule-11 checker catches an over-committed card.
const skipCapacityCheck = false
