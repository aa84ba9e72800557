package residency

// Account is the card's memory as every view shows it (`devices get`,
// `residency plan -o json`, the dashboard, gpuplane_card_memory_bytes):
// Used + Sleeping + Free = Usable. Used is what models awake hold or are
// promised (their costs, a reserved share not loaded and not lent);
// Sleeping what engines asleep keep on the card (their residuals); Free
// the rest, the lent part of a sleeping warm model's share included.
type Account struct{ Used, Sleeping, Free int64 }

// Account returns the ledger's memory as every view shows it.
func (l Ledger) Account() Account {
	return Account{Used: l.Claimed - l.Sleeping, Sleeping: l.Sleeping, Free: l.Usable - l.Claimed}
}
