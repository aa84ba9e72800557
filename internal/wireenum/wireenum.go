// Package wireenum is the one home of what the wire's residency and
// priority enums mean inside gpuplane: pb.Residency in the card-fit rule's
// words (cardfit.Residency, which the scheduler and the residency
// controller use too) and pb.Priority as a priority class (class.Class,
// which the gateway's queue and the residency controller rank by), both
// ways. The state machine, the placer, the card manager, the gateway's
// wiring and the descriptor read them here, so an unspecified value reads
// alike everywhere: pinned and standard.
//
// It is a leaf: it imports only the wire types and the shared vocabulary.
package wireenum

import (
	"github.com/gpuplane/gpuplane/internal/cardfit"
	"github.com/gpuplane/gpuplane/internal/class"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Residency is r in the card-fit rule's words; unspecified (and any value
// this version does not know) reads as pinned.
func Residency(r pb.Residency) cardfit.Residency {
	switch r {
	case pb.Residency_RESIDENCY_WARM:
		return cardfit.Warm
	case pb.Residency_RESIDENCY_ON_DEMAND:
		return cardfit.OnDemand
	}
	return cardfit.Pinned
}

// ResidencyPB is the wire's value of r.
func ResidencyPB(r cardfit.Residency) pb.Residency {
	switch r {
	case cardfit.Warm:
		return pb.Residency_RESIDENCY_WARM
	case cardfit.OnDemand:
		return pb.Residency_RESIDENCY_ON_DEMAND
	}
	return pb.Residency_RESIDENCY_PINNED
}

// Class is the priority class of p; unspecified (and any value this
// version does not know) reads as standard.
func Class(p pb.Priority) class.Class {
	switch p {
	case pb.Priority_PRIORITY_INTERACTIVE:
		return class.Interactive
	case pb.Priority_PRIORITY_BACKGROUND:
		return class.Background
	}
	return class.Standard
}

// Priority is the wire's value of c.
func Priority(c class.Class) pb.Priority {
	switch c {
	case class.Interactive:
		return pb.Priority_PRIORITY_INTERACTIVE
	case class.Background:
		return pb.Priority_PRIORITY_BACKGROUND
	}
	return pb.Priority_PRIORITY_STANDARD
}
