// Command slowbody opens -conns connections to a gateway port, each sending
// the headers of a chat completion with a -size byte body and then one
// byte of it per -every, and reports when the server answered and closed
// each: every port must time out slow clients.
//
//	gpuplane agent --dev --gateway-port 17420 &
//	go run ./bench/slowbody -addr 127.0.0.1:17420
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7420", "the gateway's host:port")
	conns := flag.Int("conns", 200, "slow connections")
	size := flag.Int("size", 1000, "Content-Length of each body")
	every := flag.Duration("every", time.Second, "one byte of the body per interval")
	wait := flag.Duration("wait", 2*time.Minute, "give up on a connection still open after this long")
	flag.Parse()

	stop := make(chan struct{})
	type result struct {
		status string
		after  time.Duration
	}
	results := make([]result, *conns)
	var wg sync.WaitGroup
	for i := range *conns {
		start := time.Now()
		c, err := net.Dial("tcp", *addr)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", *size)
		go func() {
			t := time.NewTicker(*every)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}()
		wg.Go(func() {
			defer c.Close()
			_ = c.SetReadDeadline(start.Add(*wait))
			br := bufio.NewReader(c)
			status := "no answer"
			if resp, err := http.ReadResponse(br, nil); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				status = resp.Status
			}
			// Read on until the server closes the connection.
			if _, err := io.Copy(io.Discard, br); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					status += ", still open"
				}
			}
			results[i] = result{status, time.Since(start)}
		})
	}
	wg.Wait()
	close(stop)
	by := map[string][]time.Duration{}
	for _, r := range results {
		by[r.status] = append(by[r.status], r.after)
	}
	fmt.Printf("%d connections trickling a %d-byte body at 1 byte per %s to %s:\n", *conns, *size, *every, *addr)
	for _, st := range slices.Sorted(maps.Keys(by)) {
		d := by[st]
		slices.Sort(d)
		fmt.Printf("  %-28s %4d  closed after %s to %s\n", st, len(d), d[0].Round(100*time.Millisecond), d[len(d)-1].Round(100*time.Millisecond))
	}
}
