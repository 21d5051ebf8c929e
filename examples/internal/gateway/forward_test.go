package gateway

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestForwardBuffered: a request whose body was buffered (GetBody set, as
// flowhttp leaves it) is forwarded from a fresh reader of
// that body, which net/http sends with the headers in one write; any other
// request keeps the reverse proxy's own body.
func TestForwardBuffered(t *testing.T) {
	const body = `{"model":"m","prompt":"hello"}`
	wrapper := &stubBody{strings.NewReader("the wrapper")}

	in := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	in.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader([]byte(body))), nil }
	pr := &httputil.ProxyRequest{In: in, Out: in.Clone(in.Context())}
	pr.Out.Body = wrapper
	forwardBuffered(pr)
	require.NotEqual(t, io.ReadCloser(wrapper), pr.Out.Body)
	got, err := io.ReadAll(pr.Out.Body)
	require.NoError(t, err)
	require.Equal(t, body, string(got))

	unbuffered := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	pr = &httputil.ProxyRequest{In: unbuffered, Out: unbuffered.Clone(unbuffered.Context())}
	pr.Out.Body = wrapper
	forwardBuffered(pr)
	require.Equal(t, io.ReadCloser(wrapper), pr.Out.Body, "no GetBody: the reverse proxy's body is kept")

	pr = &httputil.ProxyRequest{In: in, Out: in.Clone(in.Context())}
	pr.Out.Body = nil
	forwardBuffered(pr)
	require.Nil(t, pr.Out.Body, "no body to forward: none is made up")
}

// stubBody stands for httputil's wrapper of the inbound body.
type stubBody struct{ io.Reader }

func (*stubBody) Close() error { return nil }
