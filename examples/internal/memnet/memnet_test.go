package memnet_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flowgate/flowgate/examples/internal/memnet"
)

// An HTTP server and client on one Network, in a synctest bubble: the
// handler's sleep takes virtual time, and a closed listener refuses dials.
func TestHTTPOnVirtualTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n memnet.Network
		ln, url := n.Listen()
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(time.Hour)
			_, _ = io.WriteString(w, "ok")
		})}
		go func() { _ = srv.Serve(ln) }()
		tr := &http.Transport{DialContext: n.DialContext}
		c := &http.Client{Transport: tr}

		start := time.Now()
		resp, err := c.Get(url + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "ok" || time.Since(start) != time.Hour {
			t.Fatalf("got %q after %v, want ok after 1h", body, time.Since(start))
		}

		tr.CloseIdleConnections()
		_ = srv.Close()
		if _, err := c.Get(url + "/"); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("after Close: %v, want net.ErrClosed", err)
		}
		if _, err := c.Get("http://mem9:80/"); err == nil {
			t.Fatal("dial to no listener succeeded")
		}
	})
}
