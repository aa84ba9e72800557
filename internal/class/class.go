// Package class is the priority-class vocabulary shared by the gateway's
// request queue and the residency controller: one type, so a request's class
// and a deployment's rank are the same value. It imports nothing of the
// project, so both can import it without one reaching into the other.
package class

import (
	"fmt"
	"strings"
)

// Class is a priority class; a higher value outranks a lower one.
type Class uint8

const (
	Background Class = iota
	Standard
	Interactive
	// Count is the number of classes; valid classes are below it.
	Count
)

func (c Class) String() string {
	switch c {
	case Background:
		return "background"
	case Standard:
		return "standard"
	case Interactive:
		return "interactive"
	}
	return fmt.Sprintf("Class(%d)", uint8(c))
}

// Parse reads a class's name (interactive, standard, background; case and
// surrounding space ignored).
func Parse(s string) (Class, bool) {
	s = strings.TrimSpace(s)
	for c := range Count {
		if strings.EqualFold(s, c.String()) {
			return c, true
		}
	}
	return 0, false
}
