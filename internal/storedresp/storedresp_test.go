package storedresp

import (
	"net/http"
	"reflect"
	"testing"
)

func TestStoredRoundTrip(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}}
	b := Encode(201, h, []byte(`{"id":1}`))
	st, h2, body, err := Decode(b)
	if err != nil || st != 201 || !reflect.DeepEqual(h, h2) || string(body) != `{"id":1}` {
		t.Fatalf("round trip: %d %v %q %v", st, h2, body, err)
	}
}

// A replay writes the stored fields into the response's header: only once
// the whole record is known to be well formed, and so that adding a value
// to one field leaves the others as stored.
func TestStoredFieldsIntoAHeader(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}, "X-Id": {"7"}}
	b := Encode(201, h, []byte(`{"id":1}`))
	for cut := 1; cut < len(b)-len(`{"id":1}`); cut++ {
		dst := http.Header{"Vary": {"Origin"}}
		if _, _, err := DecodeInto(b[:cut], dst); err == nil {
			continue // a shorter body, still well formed
		}
		if !reflect.DeepEqual(dst, http.Header{"Vary": {"Origin"}}) {
			t.Fatalf("a record cut at %d set fields before failing: %v", cut, dst)
		}
	}
	dst := http.Header{"Vary": {"Origin"}, "X-Id": {"old"}}
	st, body, err := DecodeInto(b, dst)
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

func FuzzDecode(f *testing.F) {
	f.Add(Encode(200, http.Header{"A": {"b"}}, []byte("body")))
	f.Add([]byte{1, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, h, _, err := Decode(b)
		if err == nil && (st < 100 || st > 999 || h == nil) {
			t.Fatalf("accepted status %d", st)
		}
	})
}
