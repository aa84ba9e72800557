#!/bin/sh
# Writes a descriptor of one sim base model (lorachat, a name the README
# walkthrough does not use) with N LoRA adapters (default
# 1000), 4 on the card at once, on a shared l4 accelerator. Adapter a0007 is
# private to tenant acme.
#   sh examples/adapters/gen.sh 1000 > /tmp/adapters.yaml
n=${1:-1000}
cat <<YAML
resource: Accelerator
resourceVersion: v1
metadata: {name: lora}
spec: {device: l4, tenancy: shared, maxModels: 2}
---
resource: ModelDeployment
resourceVersion: v1
metadata: {name: lorachat}
spec:
  model: sim://llama-3.1-8b
  placement: {accelerator: lora}
  residency: onDemand
  priority: interactive
  engine:
    kind: sim
    memoryPercent: 60
    maxAdapters: 4
    # Adapter loads drawn from GenTD26's measured LoRA loads (median 4.4 s),
    # shrunk fiftyfold so that the demo pages quickly.
    args: [--tokens-per-second, "200", --lora-load-scale, "0.02"]
  adapters:
YAML
i=0
while [ "$i" -lt "$n" ]; do
  name=$(printf 'a%04d' "$i")
  if [ "$i" -eq 7 ]; then
    echo "    - {name: $name, source: /adapters/$name, rank: 16, tenants: [acme]}"
  else
    echo "    - {name: $name, source: /adapters/$name, rank: 16}"
  fi
  i=$((i + 1))
done
