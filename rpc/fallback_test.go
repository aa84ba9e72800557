package rpc_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestUnknownProcedureAndContentType: what no service serves, and a body
// in a content type connect does not speak, are answered with errors in
// the caller's protocol (Connect error JSON, or a gRPC status), not a 404
// page or an empty 415.
func TestUnknownProcedureAndContentType(t *testing.T) {
	api := startServers(t, 1, false)[0].api
	send := func(method, path, contentType, body string) (*http.Response, connectError) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+api+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		var ce connectError
		if resp.StatusCode != http.StatusOK {
			if err := json.Unmarshal(data, &ce); err != nil || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("%s %s (%s): status %d, %s body %q: not Connect error JSON",
					method, path, contentType, resp.StatusCode, resp.Header.Get("Content-Type"), data)
			}
		}
		return resp, ce
	}
	for _, c := range []struct {
		path, contentType, body, code string
		status                        int
	}{
		{"/gpuplane.v1.NoSuchService/Get", "application/json", `{}`, "unimplemented", 404},
		{"/gpuplane.v1.AcceleratorService/NoSuchMethod", "application/json", `{}`, "unimplemented", 404},
		{"/gpuplane.v1.AcceleratorService/ListAccelerators", "text/plain", `{}`, "invalid_argument", 415},
		{"/gpuplane.v1.AcceleratorService/ListAccelerators", "", `{}`, "invalid_argument", 415},
		// connect's own errors pass as they were.
		{"/gpuplane.v1.AcceleratorService/GetAccelerator", "application/json", `{"name":"none"}`, "not_found", 404},
	} {
		resp, ce := send(http.MethodPost, c.path, c.contentType, c.body)
		if ce.Code != c.code || ce.Message == "" || resp.StatusCode != c.status {
			t.Errorf("POST %s (%s): status %d, %+v; want %d, %s with a message", c.path, c.contentType, resp.StatusCode, ce, c.status, c.code)
		}
	}
	// A gRPC call of an unknown method gets gRPC's status 12, unimplemented.
	for _, path := range []string{"/gpuplane.v1.NoSuchService/Get", "/gpuplane.v1.AcceleratorService/NoSuchMethod"} {
		resp, _ := send(http.MethodPost, path, "application/grpc", "")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Grpc-Status") != "12" || resp.Header.Get("Grpc-Message") == "" {
			t.Errorf("gRPC %s: status %d, grpc-status %q; want 200 with grpc-status 12 and a message", path, resp.StatusCode, resp.Header.Get("Grpc-Status"))
		}
	}
	// A browser's page that does not exist stays a plain 404.
	resp, err := http.Get("http://" + api + "/no-such-page")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /no-such-page: status %d, want 404", resp.StatusCode)
	}
}
