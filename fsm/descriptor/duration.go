package descriptor

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Duration is a span of time written as Go and Kubernetes write them: a
// number with a unit, such as 90s, 10m or 1h30m.
type Duration struct {
	time.Duration
}

// ParseDuration parses a duration such as "10m" or "1h30m".
func ParseDuration(s string) (Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return Duration{}, fmt.Errorf("invalid duration %q: want a number with a unit, such as 90s, 10m or 1h30m", s)
	}
	return Duration{d}, nil
}

// CheckYAMLScalar (strictyaml.Scalar) accepts a string duration only: a bare number has no unit.
func (*Duration) CheckYAMLScalar(v any) string {
	s, ok := v.(string)
	if !ok {
		return fmt.Sprintf("must be a duration such as 90s, 10m or 1h30m, got %s", describe(v))
	}
	if _, err := ParseDuration(s); err != nil {
		return err.Error()
	}
	return ""
}

// UnmarshalJSON accepts "10m".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("must be a duration such as 90s, 10m or 1h30m, got %s", b)
	}
	parsed, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*d = parsed
	return nil
}

// MarshalJSON writes the duration as Go formats it ("10m0s").
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.String())
}
