package rpc_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

// TestSlowBodyTimedOut: a request body trickled a byte at a time is cut
// once the body read timeout passes, while a stream that outlives the
// timeout (events --follow) is not, over HTTP/1.1 and h2c both.
func TestSlowBodyTimedOut(t *testing.T) {
	const timeout = time.Second
	api := startServers(t, 1, false, func(c *rpc.Config) { c.BodyReadTimeout = timeout })[0].api

	conn, err := net.Dial("tcp", api)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /gpuplane.v1.AcceleratorService/CreateAccelerator HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
	answered := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(conn) // until the server answers and closes
		answered <- string(b)
	}()
	// A byte every 50ms would take 50s to send the body; the server must
	// give up long before (it never did: the limit is what a loaded
	// machine can take, not the timeout).
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(45 * time.Second)
trickle:
	for {
		select {
		case <-answered:
			break trickle
		case <-limit:
			t.Fatal("a body trickled for 45s was still being read; want it cut after the body read timeout")
		case <-tick.C:
			if _, err := conn.Write([]byte(" ")); err != nil {
				<-answered
				break trickle
			}
		}
	}

	// Streams that outlive the timeout keep going: an event applied after
	// several timeouts still arrives.
	for _, c := range []struct {
		name string
		http *http.Client
	}{{"HTTP/1.1", &http.Client{}}, {"h2c", rpc.HTTPClient()}} {
		events := gpuplanev1connect.NewEventServiceClient(c.http, "http://"+api)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		stream, err := events.Watch(ctx, connect.NewRequest(&pb.WatchRequest{Follow: true}))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		time.Sleep(3 * timeout)
		accs := gpuplanev1connect.NewAcceleratorServiceClient(rpc.HTTPClient(), "http://"+api)
		name := "after-" + map[string]string{"HTTP/1.1": "h1", "h2c": "h2"}[c.name]
		if _, err := accs.CreateAccelerator(ctx, connect.NewRequest(&pb.CreateAcceleratorRequest{Name: name, Spec: &pb.AcceleratorSpec{Device: "l4"}})); err != nil {
			t.Fatal(err)
		}
		got := false
		for !got && stream.Receive() {
			got = strings.Contains(stream.Msg().GetEvent().String(), name)
		}
		if !got {
			t.Errorf("%s: events --follow ended after %v (%v); want it open past the body read timeout", c.name, 3*timeout, stream.Err())
		}
		stream.Close()
		cancel()
	}
}

// TestWatchAnswersBeforeTheFirstEvent: a following watch whose filter
// matches nothing yet is answered at once (the call returns, the stream is
// open), and an event applied later still arrives. A client node's executor
// waits for this answer before it acts on the replicas already placed on it.
func TestWatchAnswersBeforeTheFirstEvent(t *testing.T) {
	api := startServers(t, 1, false)[0].api
	for _, c := range []struct {
		name string
		http *http.Client
	}{{"HTTP/1.1", &http.Client{}}, {"h2c", rpc.HTTPClient()}} {
		events := gpuplanev1connect.NewEventServiceClient(c.http, "http://"+api)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		name := "later-" + map[string]string{"HTTP/1.1": "h1", "h2c": "h2"}[c.name]
		opened := make(chan error, 1)
		var stream *connect.ServerStreamForClient[pb.WatchResponse]
		go func() {
			var err error
			stream, err = events.Watch(ctx, connect.NewRequest(&pb.WatchRequest{Follow: true, Filter: &pb.EventFilter{Resource: "accelerator/" + name}}))
			opened <- err
		}()
		select {
		case err := <-opened:
			if err != nil {
				t.Fatalf("%s: watch: %v", c.name, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: a watch with nothing to send yet was not answered in 20s", c.name)
		}
		accs := gpuplanev1connect.NewAcceleratorServiceClient(rpc.HTTPClient(), "http://"+api)
		if _, err := accs.CreateAccelerator(ctx, connect.NewRequest(&pb.CreateAcceleratorRequest{Name: name, Spec: &pb.AcceleratorSpec{Device: "l4"}})); err != nil {
			t.Fatal(err)
		}
		if !stream.Receive() || !strings.Contains(stream.Msg().GetEvent().String(), name) {
			t.Errorf("%s: the event applied after the watch opened: %v, %v", c.name, stream.Msg(), stream.Err())
		}
		stream.Close()
		cancel()
	}
}
