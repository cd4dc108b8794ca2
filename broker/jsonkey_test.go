package broker

import (
	"encoding/json"
	"testing"

	"github.com/idemgo/idem"
)

// referenceJSONKey is the decoding implementation JSONKey replaced: the
// whole body into a map, then the field. The fast scan must agree with it.
func referenceJSONKey(body []byte, field string) (string, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil {
		return "", err
	}
	raw, ok := doc[field]
	if !ok {
		return "", errNotObject
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil && s != "" {
		return s, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		return n.String(), nil
	}
	return "", errNotObject
}

var jsonKeySeeds = []string{
	`{"correlation_id":"PAY-2","n":42}`,
	`{"n":-1.5e3,"correlation_id" : "A\u00e9\"b" }`,
	`{"correlation_id":"first","correlation_id":"last"}`,
	`{"nested":{"correlation_id":"no"},"list":["correlation_id",{"x":"}"}],"correlation_id":"yes"}`,
	`{"correl\u0061tion_id":"escaped name"}`,
	`{"correlation_id":null}`,
	`{"correlation_id":""}`,
	`{"correlation_id":true}`,
	`{"correlation_id":"\xff\xfe"}`,
	`["correlation_id"]`,
	`null`,
	`{}`,
	` {"correlation_id" :	"ws" } `,
	`{"correlation_id":"a"`,
	"",
}

func FuzzJSONKey(f *testing.F) {
	for _, s := range jsonKeySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := jsonField(body, "correlation_id")
		want, werr := referenceJSONKey(body, "correlation_id")
		if werr == nil && want == "" {
			// The decoder read null as an empty key; the scan refuses it.
			if err == nil {
				t.Fatalf("%q: got %q, want an error for a null field", body, got)
			}
			return
		}
		if (err != nil) != (werr != nil) || got != want {
			t.Fatalf("%q: scan = %q, %v; decoder = %q, %v", body, got, err, want, werr)
		}
	})
}

func TestJSONKeySeeds(t *testing.T) {
	for _, tt := range []struct {
		body, want string
	}{
		{jsonKeySeeds[0], "PAY-2"},
		{jsonKeySeeds[1], "Aé\"b"},
		{jsonKeySeeds[2], "last"},
		{jsonKeySeeds[3], "yes"},
		{jsonKeySeeds[4], "escaped name"},
		{jsonKeySeeds[12], "ws"},
	} {
		got, err := JSONKey("correlation_id")(msg{body: tt.body})
		if err != nil || got != tt.want {
			t.Errorf("%s: got %q, %v; want %q", tt.body, got, err, tt.want)
		}
	}
	for _, body := range []string{jsonKeySeeds[5], jsonKeySeeds[6], jsonKeySeeds[7], jsonKeySeeds[9], jsonKeySeeds[10], jsonKeySeeds[11], jsonKeySeeds[13], ""} {
		if got, err := JSONKey("correlation_id")(msg{body: body}); err == nil {
			t.Errorf("%q: got key %q, want an error", body, got)
		}
	}
}

// BenchmarkKeyExtraction compares, per message, reading the key from a
// header, scanning the body for it (JSONKey), decoding the body into a map
// (what JSONKey did before), and fingerprinting the body.
func BenchmarkKeyExtraction(b *testing.B) {
	m := msg{h: map[string]string{"Correlation-Id": "PAY-1"},
		body: `{"correlation_id":"PAY-123456","amount":100,"currency":"EUR","customer":{"id":"C-9","name":"Ada"}}`}
	body := m.Body()
	b.Run("header", func(b *testing.B) {
		k := HeaderKey("Correlation-Id")
		b.ReportAllocs()
		for b.Loop() {
			if _, err := k(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json-scan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := jsonField(body, "correlation_id"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json-decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := referenceJSONKey(body, "correlation_id"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fingerprint", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = idem.Fingerprint(body)
		}
	})
}
