package descriptor

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strings"
)

// Quantity is an amount of memory written the Kubernetes way: plain bytes
// (21474836480), with a binary suffix (512Mi, 20Gi, 1.5Ti: powers of 1024)
// or with a decimal one (20G = 20×10⁹ bytes, 500M, 1.5T: powers of 1000).
// gpuplane accounts memory in MiB, so a quantity is converted to MiB and
// rounded up to a whole MiB: a memory promise is never smaller than what
// was written (20G = 19073.49 MiB becomes 19074Mi).
type Quantity struct {
	// MiB is the amount in mebibytes.
	MiB uint64
}

const mib = 1 << 20

// quantitySuffixes are the accepted unit suffixes and their sizes in bytes:
// Kubernetes' binary (Ki … Ei) and decimal (k … E) suffixes.
var quantitySuffixes = map[string]*big.Int{
	"":   big.NewInt(1),
	"Ki": new(big.Int).Lsh(big.NewInt(1), 10),
	"Mi": new(big.Int).Lsh(big.NewInt(1), 20),
	"Gi": new(big.Int).Lsh(big.NewInt(1), 30),
	"Ti": new(big.Int).Lsh(big.NewInt(1), 40),
	"Pi": new(big.Int).Lsh(big.NewInt(1), 50),
	"Ei": new(big.Int).Lsh(big.NewInt(1), 60),
	"k":  new(big.Int).Exp(big.NewInt(10), big.NewInt(3), nil),
	"M":  new(big.Int).Exp(big.NewInt(10), big.NewInt(6), nil),
	"G":  new(big.Int).Exp(big.NewInt(10), big.NewInt(9), nil),
	"T":  new(big.Int).Exp(big.NewInt(10), big.NewInt(12), nil),
	"P":  new(big.Int).Exp(big.NewInt(10), big.NewInt(15), nil),
	"E":  new(big.Int).Exp(big.NewInt(10), big.NewInt(18), nil),
}

const quantityForms = "want bytes, or a number with a decimal suffix k, M, G, T, P (20G = 20×10⁹ bytes) or a binary one Ki, Mi, Gi, Ti, Pi (20Gi = 20×2³⁰ bytes)"

// ParseQuantity parses a memory quantity such as "20Gi", "20G" or
// "536870912", rounding it up to a whole MiB.
func ParseQuantity(s string) (Quantity, error) {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(s)
	}
	num, suffix := s[:i], s[i:]
	if num == "" || strings.Count(num, ".") > 1 || strings.HasPrefix(num, ".") || strings.HasSuffix(num, ".") {
		return Quantity{}, fmt.Errorf("invalid quantity %q: %s", s, quantityForms)
	}
	unit, ok := quantitySuffixes[suffix]
	if !ok {
		// Common spellings that are not Kubernetes quantities get the one
		// they most likely mean.
		if short, ok := strings.CutSuffix(suffix, "B"); ok && quantitySuffixes[short] != nil && short != "" {
			return Quantity{}, fmt.Errorf("invalid quantity %q: unknown suffix %q, write %s%s (decimal) or %s%si (binary)", s, suffix, num, short, num, strings.ToUpper(short[:1]))
		}
		if suffix == "K" {
			return Quantity{}, fmt.Errorf("invalid quantity %q: unknown suffix \"K\", write %sk (decimal) or %sKi (binary)", s, num, num)
		}
		return Quantity{}, fmt.Errorf("invalid quantity %q: unknown suffix %q, %s", s, suffix, quantityForms)
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return Quantity{}, fmt.Errorf("invalid quantity %q", s)
	}
	if r.Sign() <= 0 {
		return Quantity{}, fmt.Errorf("invalid quantity %q: must be more than 0", s)
	}
	r.Mul(r, new(big.Rat).SetInt(unit))
	r.Quo(r, new(big.Rat).SetInt64(mib))
	// Round up: ceil(num/den) for a positive fraction.
	n := new(big.Int).Add(r.Num(), new(big.Int).Sub(r.Denom(), big.NewInt(1)))
	n.Quo(n, r.Denom())
	if !n.IsUint64() {
		return Quantity{}, fmt.Errorf("invalid quantity %q: too large", s)
	}
	return Quantity{MiB: n.Uint64()}, nil
}

// String formats q the way the CLI's tables show memory: "20480Mi".
func (q Quantity) String() string {
	return fmt.Sprintf("%dMi", q.MiB)
}

// CheckYAMLScalar (strictyaml.Scalar) accepts a string quantity or a plain integer number of bytes.
func (*Quantity) CheckYAMLScalar(v any) string {
	var err error
	switch v := v.(type) {
	case string:
		_, err = ParseQuantity(v)
	case int:
		_, err = ParseQuantity(fmt.Sprint(v))
	case int64:
		_, err = ParseQuantity(fmt.Sprint(v))
	case uint64:
		_, err = ParseQuantity(fmt.Sprint(v))
	default:
		return fmt.Sprintf("must be a memory quantity such as 20Gi or 512Mi, got %s", describe(v))
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

// UnmarshalJSON accepts "20Gi" or a number of bytes.
func (q *Quantity) UnmarshalJSON(b []byte) error {
	var s string
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	} else {
		s = string(b)
	}
	parsed, err := ParseQuantity(s)
	if err != nil {
		return err
	}
	*q = parsed
	return nil
}

// MarshalJSON writes the quantity in MiB ("20480Mi").
func (q Quantity) MarshalJSON() ([]byte, error) {
	return json.Marshal(q.String())
}

// CPU is an amount of host CPU written the Kubernetes way: cores (2, 0.5,
// "1.5") or millicores ("500m"). gpuplane accounts CPU in millicores, so it
// must come to a whole, positive number of them.
type CPU struct {
	// Milli is the amount in thousandths of a core.
	Milli uint32
}

// ParseCPU parses a CPU quantity such as "500m", "2" or "0.5".
func ParseCPU(s string) (CPU, error) {
	s = strings.TrimSpace(s)
	num, scale := s, int64(1000)
	if n, ok := strings.CutSuffix(s, "m"); ok {
		num, scale = n, 1
	}
	digits := strings.Trim(num, "0123456789.") == "" && strings.Count(num, ".") <= 1 &&
		!strings.HasPrefix(num, ".") && !strings.HasSuffix(num, ".")
	r, ok := new(big.Rat).SetString(num)
	if num == "" || !digits || !ok {
		return CPU{}, fmt.Errorf("invalid CPU quantity %q: want cores (2, 0.5) or millicores (500m)", s)
	}
	r.Mul(r, new(big.Rat).SetInt64(scale))
	switch {
	case r.Sign() <= 0:
		return CPU{}, fmt.Errorf("invalid CPU quantity %q: must be more than 0", s)
	case !r.IsInt():
		return CPU{}, fmt.Errorf("invalid CPU quantity %q: must be a whole number of millicores", s)
	case !r.Num().IsUint64() || r.Num().Uint64() > math.MaxUint32:
		return CPU{}, fmt.Errorf("invalid CPU quantity %q: too large", s)
	}
	return CPU{Milli: uint32(r.Num().Uint64())}, nil
}

// String formats c in millicores: "500m".
func (c CPU) String() string { return fmt.Sprintf("%dm", c.Milli) }

// CheckYAMLScalar (strictyaml.Scalar) accepts a string, an integer or a decimal number of cores.
func (*CPU) CheckYAMLScalar(v any) string {
	var err error
	switch v := v.(type) {
	case string:
		_, err = ParseCPU(v)
	case int, int64, uint64, float64:
		_, err = ParseCPU(fmt.Sprint(v))
	default:
		return fmt.Sprintf("must be a CPU quantity such as 2, 0.5 or 500m, got %s", describe(v))
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

// UnmarshalJSON accepts "500m", "2" or a number of cores.
func (c *CPU) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	}
	parsed, err := ParseCPU(s)
	if err != nil {
		return err
	}
	*c = parsed
	return nil
}

// MarshalJSON writes the quantity in millicores ("500m").
func (c CPU) MarshalJSON() ([]byte, error) {
	return json.Marshal(c.String())
}
