package httpidem

import (
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

func TestStorableDropsHopByHop(t *testing.T) {
	h := http.Header{
		"Connection": {"keep-alive, X-Conn-Secret"}, "Keep-Alive": {"timeout=5"}, "X-Conn-Secret": {"s"},
		"Transfer-Encoding": {"chunked"}, "Date": {"now"}, "Content-Type": {"text/plain"}, "X-Request-Id": {"1"},
	}
	got := storable(h, false)
	want := http.Header{"Content-Type": {"text/plain"}, "X-Request-Id": {"1"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("stored headers %v, want %v", got, want)
	}
}

// readBody reads the whole body whatever Content-Length declares, and
// leaves the request's body able to give all of it again.
func TestReadBodyWhateverTheDeclaredLength(t *testing.T) {
	for _, c := range []struct {
		body     string
		declared int64
		limit    int64
		tooBig   bool
		fails    bool
	}{
		{body: "amount=2500", declared: 11, limit: 100},
		{body: "", declared: 0, limit: 100},
		{body: "amount=2500", declared: -1, limit: 100},
		{body: "amount=2500", declared: 3, limit: 100}, // more than declared: all of it
		{body: "amount=2500", declared: 3, limit: 5, tooBig: true},
		{body: "amount=2500", declared: 11, limit: 10, tooBig: true},
		{body: "amount", declared: 11, limit: 100, fails: true}, // less than declared
	} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(c.body))
		r.ContentLength = c.declared
		body, tooBig, err := readBody(r, c.limit)
		if (err != nil) != c.fails || tooBig != c.tooBig {
			t.Fatalf("%+v: tooBig %v, err %v", c, tooBig, err)
		}
		if c.fails {
			continue
		}
		if !tooBig && string(body) != c.body {
			t.Fatalf("%+v: read %q", c, body)
		}
		if again, _ := io.ReadAll(r.Body); string(again) != c.body {
			t.Fatalf("%+v: the handler would read %q", c, again)
		}
	}
}
