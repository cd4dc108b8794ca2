package storedresp

import (
	"net/http"
	"reflect"
	"testing"

	"github.com/idemgo/idem/internal/race"
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

// The extra fields a replay adds come after the stored ones (replacing a
// stored field of their name), share the stored fields' array, and each
// takes a value of its own when a value is added; a record that is not well
// formed sets none of them.
func TestExtraFields(t *testing.T) {
	stored := Encode(201, http.Header{"Content-Type": {"application/json"}, "Idempotent-Replayed": {"stored"}}, nil)
	for _, b := range [][]byte{stored, Encode(204, nil, nil)} {
		dst := http.Header{}
		if _, _, err := DecodeInto(b, dst, Field{"Idempotent-Replayed", "true"}, Field{"Idempotency-Key-Expires", "then"}); err != nil {
			t.Fatal(err)
		}
		if dst.Get("Idempotent-Replayed") != "true" || len(dst["Idempotent-Replayed"]) != 1 || dst.Get("Idempotency-Key-Expires") != "then" {
			t.Fatalf("decoded with extra fields: %v", dst)
		}
		dst.Add("Idempotent-Replayed", "added")
		if dst.Get("Idempotency-Key-Expires") != "then" {
			t.Fatalf("adding a value to one extra field changed the next: %v", dst)
		}
	}
	dst := http.Header{}
	if _, _, err := DecodeInto(stored[:3], dst, Field{"Idempotent-Replayed", "true"}); err == nil || len(dst) != 0 {
		t.Fatalf("a corrupt record: %v, set %v", err, dst)
	}
}

// TestExtraFieldsAllocations: a decode with extra fields makes two
// allocations, the stored fields' string and the array of every value.
func TestExtraFieldsAllocations(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates on its own account")
	}
	stored := Encode(201, http.Header{"Content-Type": {"application/json"}}, nil)
	dst := http.Header{}
	if n := testing.AllocsPerRun(100, func() {
		clear(dst)
		_, _, _ = DecodeInto(stored, dst, Field{"Idempotent-Replayed", "true"}, Field{"Idempotency-Key-Expires", "then"})
	}); n > 2 {
		t.Fatalf("%v allocations a decode with extra fields, want 2", n)
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
