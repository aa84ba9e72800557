package sim

import (
	"fmt"
	"strconv"
	"strings"
)

// Ollama from 0.30 on runs a GGUF model under a llama-server that fits its
// layers and context to the free memory it finds on the card; its
// OLLAMA_GPU_OVERHEAD is only logged and sizes the default context
// (docs/engines.md). So the ollama dialect, told the card's memory
// (--card-mib), takes what is free on its card when it loads its model:
// the card less what the other processes hold, or less under a hard limit
// (MPS's pinned memory limit, HAMi-core's), which is what CUDA then
// reports to it as the card. Without --card-mib it holds --memory-mib.

// ollamaSizeMiB is what the ollama dialect takes on a load; 0: --memory-mib.
func (s *server) ollamaSizeMiB() uint64 {
	if s.cfg.Dialect != DialectOllama || s.cfg.CardMiB == 0 {
		return 0
	}
	var size uint64
	for _, others := range s.othersMiB() {
		free := s.cfg.CardMiB - min(others, s.cfg.CardMiB)
		if s.cfg.HardLimitMiB > 0 {
			free = min(free, s.cfg.HardLimitMiB)
		}
		if size == 0 || free < size {
			size = free
		}
	}
	if size == 0 && s.cfg.HardLimitMiB > 0 {
		size = s.cfg.HardLimitMiB
	}
	return size
}

// ParseHardLimitMiB reads the memory limit a hard-limit layer puts on the
// engine's first card from its environment: MPS's
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=10365MB,1=…") or HAMi-core's
// CUDA_DEVICE_MEMORY_LIMIT ("10365m"); 0 for none.
func ParseHardLimitMiB(mps, hami string) (uint64, error) {
	if mps != "" {
		first, _, _ := strings.Cut(mps, ",")
		_, v, ok := strings.Cut(first, "=")
		if !ok {
			v = first
		}
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSuffix(v, "MB"), "M"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT %q: want ORDINAL=NMB", mps)
		}
		return n, nil
	}
	if hami != "" {
		v := strings.ToLower(hami)
		mult := uint64(1)
		switch {
		case strings.HasSuffix(v, "g"):
			v, mult = strings.TrimSuffix(v, "g"), 1024
		case strings.HasSuffix(v, "m"):
			v = strings.TrimSuffix(v, "m")
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("CUDA_DEVICE_MEMORY_LIMIT %q: want Nm or Ng", hami)
		}
		return n * mult, nil
	}
	return 0, nil
}
