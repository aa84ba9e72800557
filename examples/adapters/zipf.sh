#!/bin/sh
# Sends REQUESTS chat requests (default 2000), 16 at a time, to ENDPOINT; the
# adapter of each follows a Zipf popularity (exponent 1.1) over N adapters,
# half named chat:ADAPTER and half ADAPTER, from tenants t0..t4. Prints a
# count of HTTP status codes.
#   sh examples/adapters/zipf.sh http://127.0.0.1:PORT 2000 1000
endpoint=$1
requests=${2:-2000}
n=${3:-1000}
awk -v n="$n" -v r="$requests" -v seed=15 'BEGIN {
  srand(seed)
  for (i = 1; i <= n; i++) { h += 1 / (i ^ 1.1); cdf[i] = h }
  for (k = 0; k < r; k++) {
    x = rand() * h; lo = 1; hi = n
    while (lo < hi) { mid = int((lo + hi) / 2); if (cdf[mid] < x) lo = mid + 1; else hi = mid }
    name = sprintf("a%04d", lo - 1)
    if (name == "a0007") name = "a0008"
    if (k % 2 == 0) name = "chat:" name
    print name, "t" (k % 5)
  }
}' | xargs -P 16 -n 2 sh -c '
  curl -s -o /dev/null -w "%{http_code}\n" "$0/v1/chat/completions" \
    -H "content-type: application/json" -H "X-Gpuplane-Tenant: $2" \
    -d "{\"model\":\"$1\",\"max_tokens\":16,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
' "$endpoint" | sort | uniq -c
