package traffic

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Requests is the record in the wire's shapes (rpc's request source): of
// card where it is given, else of every card, since the time given.
// Tenant names stay on the node: each answer names them t1, t2, ... in
// the order first seen.
func (l *Log) Requests(card *uint32, since time.Time) []*pb.RequestRecord {
	cards := l.Cards()
	if card != nil {
		cards = []uint32{*card}
	}
	var out []*pb.RequestRecord
	pseudonym := map[string]string{}
	for _, c := range cards {
		for _, r := range l.Since(c, since) {
			p, ok := pseudonym[r.Tenant]
			if !ok {
				p = fmt.Sprintf("t%d", len(pseudonym)+1)
				pseudonym[r.Tenant] = p
			}
			out = append(out, &pb.RequestRecord{
				Card: c, Arrived: timestamppb.New(r.Arrived), Deployment: r.Deployment, Replica: r.Replica,
				Adapter: r.Adapter, Tenant: p, Class: r.Class, PromptTokens: int64(r.PromptTokens),
				OutputTokens: int64(r.OutputTokens), TtftSeconds: r.TTFT.Seconds(), Outcome: r.Outcome.String(),
			})
		}
	}
	return out
}
