package rpc

import (
	"io"
	"net/http"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// clientStreams holds the paths of the procedures whose client streams
// (Forward): their request body is open as long as the call, idle between
// messages, and has no deadline.
var clientStreams = func() map[string]bool {
	out := map[string]bool{}
	for _, name := range services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			continue
		}
		sd, ok := d.(protoreflect.ServiceDescriptor)
		if !ok {
			continue
		}
		for i := 0; i < sd.Methods().Len(); i++ {
			if m := sd.Methods().Get(i); m.IsStreamingClient() {
				out["/"+name+"/"+string(m.Name())] = true
			}
		}
	}
	return out
}()

// bodyDeadline gives the request body of a unary or server-streaming call
// timeout to arrive whole, as readHeaderTimeout does for the headers: a
// client trickling its body would otherwise hold a connection (and a
// handler) for good. The deadline is lifted once the body has been read,
// so a long answer (events --follow) is not cut: it is a read deadline,
// never a write one.
func bodyDeadline(w http.ResponseWriter, r *http.Request, timeout time.Duration) {
	if timeout <= 0 || r.Body == nil || r.Body == http.NoBody || clientStreams[r.URL.Path] {
		return
	}
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(timeout)) != nil {
		return // the connection cannot take deadlines: nothing to lift either
	}
	r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
}

// deadlineBody lifts the read deadline when its body ends. A failed read
// (the deadline passed) keeps it: the server's own read of what is left of
// the body, after the handler, must not wait for the trickle either.
type deadlineBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	lifted bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.lifted {
		b.lifted = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
