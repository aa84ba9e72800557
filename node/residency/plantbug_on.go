//go:build residency_plantbug

package residency

// skipI3 plants a bug for chaos tests: the policy treats busy engines as idle
// victims and the ledger check skips I3. Never build a release with
// residency_plantbug.
const skipI3 = true
