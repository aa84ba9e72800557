package gateway

import (
	"bytes"
	"encoding/json"
)

// Engine controls in client bodies.
//
// Some fields of a request body steer the engine rather than the
// generation: which adapters it applies, which slot and cache it uses,
// where it puts the request in its own queue. The gateway sets those
// itself from what the caller may do (its tenant, the model it named,
// its class); a client that sent them could apply another tenant's
// private adapter, run in a slot that holds another tenant's prompt, or
// jump the engine's queue. Each is listed here once, with what the
// gateway does when a client sends it: refused with 400 naming the field
// and the rule, or its value checked (a request id, which engines echo
// and refuse when already running, is passed on). Go's decoder matches keys with any
// case and with escapes ("\u006cora"), so a spelling that an engine would
// not read as the field is refused too: never less than the engine reads.

// controlAction is what the gateway does with an engine control a client
// sent.
type controlAction uint8

const (
	// refuse: any value is refused (400, code engine_control).
	refuse controlAction = iota + 1
	// checkBool: the value must be true or false; false only gives up
	// what the gateway would allow (cache reuse), and true is replaced
	// where the gateway decides otherwise (prepare appends its own).
	checkBool
	// checkString: the value must be a non-empty string, passed on.
	checkString
)

// engineControl is one engine control field.
type engineControl struct {
	name   string
	action controlAction
	// rule says who sets it and how a client asks for what it may have.
	rule string
	get  func(*controlFields) json.RawMessage
}

// controlFields are the engine controls as the body's decoder reads them
// (body embeds it); engineControls says what each means.
type controlFields struct {
	LoRA             json.RawMessage `json:"lora"`
	LoRAPath         json.RawMessage `json:"lora_path"`
	IDSlot           json.RawMessage `json:"id_slot"`
	SlotID           json.RawMessage `json:"slot_id"`
	CachePrompt      json.RawMessage `json:"cache_prompt"`
	CacheSalt        json.RawMessage `json:"cache_salt"`
	Priority         json.RawMessage `json:"priority"`
	RequestID        json.RawMessage `json:"request_id"`
	RID              json.RawMessage `json:"rid"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	BootstrapHost    json.RawMessage `json:"bootstrap_host"`
	BootstrapPort    json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom    json.RawMessage `json:"bootstrap_room"`
	DataParallelRank json.RawMessage `json:"data_parallel_rank"`
}

const (
	adapterRule  = "the gateway applies the adapters the caller may use: name an adapter as the model (\"model\": \"NAME:ADAPTER\", or its bare name as GET /v1/models lists it)"
	slotRule     = "the gateway picks each request's llama.cpp slot, so that no tenant runs in a slot holding another tenant's prompt"
	requestRule  = "echoed in the answer's id; an engine refuses an id it is already running, so no answer goes to another request"
	transferRule = "disaggregated serving is set up by the deployment, not per request"
)

// engineControls is every engine control the gateway knows, with what it
// does when a client sends it.
var engineControls = []engineControl{
	{"lora", refuse, "llama.cpp's per-request adapter scales: " + adapterRule, func(c *controlFields) json.RawMessage { return c.LoRA }},
	{"lora_path", refuse, "SGLang's per-request adapter: " + adapterRule, func(c *controlFields) json.RawMessage { return c.LoRAPath }},
	{"id_slot", refuse, "llama.cpp's slot: " + slotRule, func(c *controlFields) json.RawMessage { return c.IDSlot }},
	{"slot_id", refuse, "llama.cpp's slot (its older name): " + slotRule, func(c *controlFields) json.RawMessage { return c.SlotID }},
	{"cache_prompt", checkBool, "llama.cpp's prompt-cache reuse: false gives it up; the gateway allows reuse only of a slot holding the caller's own prompt", func(c *controlFields) json.RawMessage { return c.CachePrompt }},
	{"cache_salt", refuse, "vLLM's prefix-cache salt: the gateway salts each tenant's cache with a salt of its own, so tenants never share cached prefixes", func(c *controlFields) json.RawMessage { return c.CacheSalt }},
	{"priority", refuse, "the engine's scheduling priority: the gateway sets it from the request's class (header " + ClassHeader + " may lower the class)", func(c *controlFields) json.RawMessage { return c.Priority }},
	{"request_id", checkString, "vLLM's request id: " + requestRule, func(c *controlFields) json.RawMessage { return c.RequestID }},
	{"rid", checkString, "SGLang's request id: " + requestRule, func(c *controlFields) json.RawMessage { return c.RID }},
	{"kv_transfer_params", refuse, "vLLM's KV-cache transfer between engines: " + transferRule, func(c *controlFields) json.RawMessage { return c.KVTransferParams }},
	{"bootstrap_host", refuse, "SGLang's prefill/decode bootstrap: " + transferRule, func(c *controlFields) json.RawMessage { return c.BootstrapHost }},
	{"bootstrap_port", refuse, "SGLang's prefill/decode bootstrap: " + transferRule, func(c *controlFields) json.RawMessage { return c.BootstrapPort }},
	{"bootstrap_room", refuse, "SGLang's prefill/decode bootstrap: " + transferRule, func(c *controlFields) json.RawMessage { return c.BootstrapRoom }},
	{"data_parallel_rank", refuse, "the engine's data-parallel rank: the gateway and the engine place requests", func(c *controlFields) json.RawMessage { return c.DataParallelRank }},
}

// checkControls refuses the engine controls a client may not set (400,
// code engine_control, naming the field and the rule) and checks the
// values of those it may.
func (c *controlFields) checkControls() *apiError {
	for _, ec := range engineControls {
		raw := bytes.TrimSpace(ec.get(c))
		if len(raw) == 0 {
			continue
		}
		switch ec.action {
		case refuse:
			return invalidf(ec.name, "engine_control", "%s may not be set by a client: %s", ec.name, ec.rule)
		case checkBool:
			if !isJSON(raw, "true") && !isJSON(raw, "false") {
				return invalidf(ec.name, "invalid_type", "%s is %s: it must be true or false (%s)", ec.name, kindOf(raw), ec.rule)
			}
		case checkString:
			if kindOf(raw) != "a string" || isJSON(raw, `""`) {
				return invalidf(ec.name, "invalid_value", "%s is %s: it must be a non-empty string (%s)", ec.name, raw, ec.rule)
			}
		}
	}
	return nil
}
