package cluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// BenchmarkApply measures committed writes per second on a single node with
// fsync on, from 1 and from 64 concurrent callers. With 64 callers raft's
// BatchApplyCh groups many entries into one append and one fsync.
func BenchmarkApply(b *testing.B) {
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			c, _ := startDev(b)
			ctx := context.Background()
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						res, err := c.Apply(ctx, registerNode("bench"))
						if err != nil || res.Code != pb.Code_CODE_OK {
							b.Errorf("apply: %v, %v", res, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}
