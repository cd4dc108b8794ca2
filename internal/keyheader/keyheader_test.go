package keyheader

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
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
		got, err := Parse(tt.in, 255)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("Parse(%.30q) = %q, %v; want %q, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{`"abc"`, `abc`, `"a\"b"`, `""`, `"x";p`, "\x00", `"\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := Parse(v, 255)
		if err != nil {
			return
		}
		if k == "" || len(k) > 255 {
			t.Fatalf("Parse(%q) accepted %q", v, k)
		}
		// What a sender formats, the receiver parses back to the same key.
		back, err := Parse(Format(k), 255)
		if err != nil || back != k {
			t.Fatalf("Format(%q) = %s does not parse back: %q %v", k, Format(k), back, err)
		}
	})
}
