package httpidem

import (
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: `"abc"`, want: "abc"},
		{in: `abc`, want: "abc"},
		{in: ` "8e03978e-40d5-43e8-bc93-6894a57f9324" `, want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{in: `8e03978e-40d5-43e8-bc93-6894a57f9324`, want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{in: `"with space"`, want: "with space"},
		{in: `"q\"uote\\d"`, want: `q"uote\d`},
		{in: `ORD-20260514-0001:retry/1`, want: "ORD-20260514-0001:retry/1"},
		{in: ``, wantErr: true},
		{in: `""`, wantErr: true},
		{in: `"abc`, wantErr: true},
		{in: `"a\b"`, wantErr: true},
		{in: `"abc";x=1`, wantErr: true},
		{in: `"a", "b"`, wantErr: true},
		{in: `a b`, wantErr: true},
		{in: `a,b`, wantErr: true},
		{in: "\"caf\xc3\xa9\"", wantErr: true},
		{in: `"` + strings.Repeat("k", 255) + `"`, want: strings.Repeat("k", 255)},
		{in: `"` + strings.Repeat("k", 256) + `"`, wantErr: true},
		{in: strings.Repeat("k", 256), wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseKey(tt.in, 255)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseKey(%.30q) = %q, %v; want %q, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, `abc`, `"a\"b"`, `""`, `"x";p`, "\x00", `"\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := ParseKey(v, 255)
		if err != nil {
			return
		}
		if k == "" || len(k) > 255 {
			t.Fatalf("ParseKey(%q) accepted %q", v, k)
		}
		// What a sender formats, the receiver parses back to the same key.
		back, err := ParseKey(FormatKey(k), 255)
		if err != nil || back != k {
			t.Fatalf("FormatKey(%q) = %s does not parse back: %q %v", k, FormatKey(k), back, err)
		}
	})
}

func TestStoredRoundTrip(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}}
	b := encodeResponse(201, h, []byte(`{"id":1}`))
	st, h2, body, err := decodeResponse(b)
	if err != nil || st != 201 || !reflect.DeepEqual(h, h2) || string(body) != `{"id":1}` {
		t.Fatalf("round trip: %d %v %q %v", st, h2, body, err)
	}
}

// A replay writes the stored fields into the response's header: only once
// the whole record is known to be well formed, and so that adding a value
// to one field leaves the others as stored.
func TestStoredFieldsIntoAHeader(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}, "X-Id": {"7"}}
	b := encodeResponse(201, h, []byte(`{"id":1}`))
	for cut := 1; cut < len(b)-len(`{"id":1}`); cut++ {
		dst := http.Header{"Vary": {"Origin"}}
		if _, _, err := decodeResponseInto(b[:cut], dst); err == nil {
			continue // a shorter body, still well formed
		}
		if !reflect.DeepEqual(dst, http.Header{"Vary": {"Origin"}}) {
			t.Fatalf("a record cut at %d set fields before failing: %v", cut, dst)
		}
	}
	dst := http.Header{"Vary": {"Origin"}, "X-Id": {"old"}}
	st, body, err := decodeResponseInto(b, dst)
	want := http.Header{"Vary": {"Origin"}, "Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}, "X-Id": {"7"}}
	if err != nil || st != 201 || string(body) != `{"id":1}` || !reflect.DeepEqual(dst, want) {
		t.Fatalf("decoded %d %q %v %v, want %v", st, body, dst, err, want)
	}
	for k := range dst {
		dst.Add(k, "added")
	}
	for k, vs := range want {
		if got := dst[k][:len(vs)]; !reflect.DeepEqual(got, vs) {
			t.Fatalf("adding values changed %s to %v", k, dst[k])
		}
	}
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(encodeResponse(200, http.Header{"A": {"b"}}, []byte("body")))
	f.Add([]byte{1, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, h, _, err := decodeResponse(b)
		if err == nil && (st < 100 || st > 999 || h == nil) {
			t.Fatalf("accepted status %d", st)
		}
	})
}

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
