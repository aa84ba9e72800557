package residency

import (
	"encoding/json"
	"errors"
	"strconv"
	"time"
)

// KeepAlive: the request that just arrived for Model (after its
// RequestArrived) asked to keep the model loaded For after it, Ollama's
// keep_alive: 0 takes it off the card once idle, negative keeps it. It
// replaces the card's idle timeouts for the model until a request without
// one arrives. It is a hint within the card's promises: a pinned model is
// never taken off, a warm one only sleeps (its share stays reserved), and
// a model kept alive is still evicted for a reserved owner's return or a
// model of higher value, as any idle one is.
type KeepAlive struct {
	Model ModelID
	For   time.Duration
}

func (KeepAlive) isEvent() {}

func (c *Controller) keepAlive(e KeepAlive) {
	if r := c.rep(e.Model); r != nil {
		r.keep, r.keepSet = e.For, true
	}
}

// ParseKeepAlive reads a request's keep_alive as Ollama does: a number of
// seconds or a duration ("5m", "1h30m", "0", "-1"); any negative value keeps the
// model loaded (-1). The gateway and the replicas' fronts both take it.
func ParseKeepAlive(raw json.RawMessage) (time.Duration, error) {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, err
	}
	var d time.Duration
	switch x := v.(type) {
	case float64:
		d = time.Duration(x * float64(time.Second))
	case string:
		if secs, err := strconv.ParseFloat(x, 64); err == nil {
			d = time.Duration(secs * float64(time.Second))
			break
		}
		var err error
		if d, err = time.ParseDuration(x); err != nil {
			return 0, errors.New(`must be a number of seconds or a duration such as "5m"; 0 unloads the model after the request, a negative value keeps it loaded`)
		}
	default:
		return 0, errors.New(`must be a number of seconds or a duration such as "5m"; 0 unloads the model after the request, a negative value keeps it loaded`)
	}
	if d < 0 {
		d = -1
	}
	return d, nil
}
