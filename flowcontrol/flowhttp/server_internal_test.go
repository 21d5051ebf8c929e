package flowhttp

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReserveRefusalFreesItsRoomAtOnce: a non-critical request refused on a
// connection of the reserve frees that connection's room before its answer
// leaves, so a connection the client dials on reading "Connection: close"
// (its next request critical, say) is accepted even while the server has
// not yet closed the refused one. Before, the room was freed only at
// StateClosed, after the close: a client quicker than the server's
// goroutine (a busy machine) had its next connection closed at accept,
// and TestGatewayServeDrainsAndReservesForCritical's critical request got
// EOF. Here the server's close never comes until the test sends it, so the
// order is fixed, not raced.
func TestReserveRefusalFreesItsRoomAtOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lim := newConnLimiter(ln, 2, 1)
	defer lim.Close()
	type accepted struct {
		c   net.Conn
		err error
	}
	acceptc := make(chan accepted, 1)
	accept := func() {
		go func() {
			c, err := lim.Accept()
			acceptc <- accepted{c, err}
		}()
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	const bound = 30 * time.Second // only a hang reaches it
	next := func() net.Conn {
		select {
		case a := <-acceptc:
			require.NoError(t, a.err)
			return a.c
		case <-time.After(bound):
			t.Fatal("no connection accepted")
			return nil
		}
	}
	// One ordinary connection, one of the reserve.
	dial()
	accept()
	first := next()
	dial()
	accept()
	reserved := next()
	require.IsType(t, &reservedConn{}, reserved)

	// A sheddable POST on the reserved connection: 503 overloaded, closed.
	h := reserveForCritical(func(*http.Request) bool { return false }, lim.release,
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("a refused request reached the handler") }))
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", nil).WithContext(connContext(context.Background(), reserved))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, ReasonOverloaded, rec.Header().Get(DroppedReasonHeader))
	require.Equal(t, "close", rec.Header().Get("Connection"))

	// The client dials again before the server has closed the refused
	// connection: accepted, not closed at once.
	third := dial()
	accept()
	refused := make(chan error, 1)
	go func() {
		_ = third.SetReadDeadline(time.Now().Add(bound))
		_, err := third.Read(make([]byte, 1))
		refused <- err
	}()
	select {
	case a := <-acceptc:
		require.NoError(t, a.err)
		defer a.c.Close()
	case err := <-refused:
		t.Fatalf("the connection after a refusal was closed at accept (%v): the refused one still held its room", err)
	}

	// The refused connection's close, when it comes, is not counted twice.
	lim.connState(reserved, http.StateClosed)
	_ = reserved.Close()
	lim.mu.Lock()
	open := lim.open
	lim.mu.Unlock()
	require.Equal(t, 2, open, "the first connection and the third")
	_ = first.Close()
}
