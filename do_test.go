package idem_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

// counted is a copyable result whose decodings are counted.
type counted struct{ N int }

var decodings int

func (c *counted) UnmarshalJSON(b []byte) error {
	decodings++
	var v struct{ N int }
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	c.N = v.N
	return nil
}

func TestDoReplayRemembersARepeatedResult(t *testing.T) {
	g, _ := newGuard(t, idem.Config{})
	ctx := context.Background()
	k := idem.Key{Scope: "test", ID: "decode-once"}
	decodings = 0
	first := func(context.Context) (counted, error) { return counted{N: 7}, nil }
	if _, err := idem.Do(ctx, g, k, first); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		v, err := idem.Do(ctx, g, k, func(context.Context) (counted, error) { t.Fatal("ran twice"); return counted{}, nil })
		if err != nil || v.N != 7 {
			t.Fatalf("replay = %+v, %v", v, err)
		}
	}
	// The first replay decodes and marks the key; the second decodes and
	// keeps the value (a key is remembered once it repeats); the rest hit.
	if decodings != 2 {
		t.Fatalf("10 replays of one stored result decoded it %d times, want 2", decodings)
	}
	// A new generation of the key stores other bytes: they are decoded, not
	// mistaken for the remembered value.
	if err := g.Forget(ctx, k); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, g, k, func(context.Context) (counted, error) { return counted{N: 8}, nil }); err != nil {
		t.Fatal(err)
	}
	v, err := idem.Do(ctx, g, k, first)
	if err != nil || v.N != 8 {
		t.Fatalf("replay of the new generation = %+v, %v; want N 8", v, err)
	}
	// Another type on the same key decodes for itself.
	type other struct{ N float64 }
	o, err := idem.Do(ctx, g, k, func(context.Context) (other, error) { return other{}, nil })
	if err != nil || o.N != 8 {
		t.Fatalf("replay as another type = %+v, %v", o, err)
	}
}

func TestDoReplayNeverSharesMutableValues(t *testing.T) {
	g, _ := newGuard(t, idem.Config{})
	ctx := context.Background()
	type withSlice struct{ Lines []string }
	type withMap struct{ Tags map[string]string }
	type withTime struct {
		At time.Time
		ID string
	}
	k := idem.Key{Scope: "test", ID: "slices"}
	if _, err := idem.Do(ctx, g, k, func(context.Context) (withSlice, error) { return withSlice{Lines: []string{"a"}}, nil }); err != nil {
		t.Fatal(err)
	}
	a, _ := idem.Do(ctx, g, k, func(context.Context) (withSlice, error) { return withSlice{}, nil })
	a.Lines[0] = "changed by the first caller"
	b, _ := idem.Do(ctx, g, k, func(context.Context) (withSlice, error) { return withSlice{}, nil })
	if b.Lines[0] != "a" {
		t.Fatalf("a caller's change reached another caller: %q", b.Lines[0])
	}
	km := idem.Key{Scope: "test", ID: "maps"}
	if _, err := idem.Do(ctx, g, km, func(context.Context) (withMap, error) { return withMap{Tags: map[string]string{"k": "v"}}, nil }); err != nil {
		t.Fatal(err)
	}
	m1, _ := idem.Do(ctx, g, km, func(context.Context) (withMap, error) { return withMap{}, nil })
	m1.Tags["k"] = "changed"
	m2, _ := idem.Do(ctx, g, km, func(context.Context) (withMap, error) { return withMap{}, nil })
	if m2.Tags["k"] != "v" {
		t.Fatalf("a caller's change reached another caller: %q", m2.Tags["k"])
	}
	// time.Time is copyable: replays agree.
	kt := idem.Key{Scope: "test", ID: "times"}
	at := time.Date(2026, 11, 30, 8, 0, 0, 0, time.FixedZone("X", 3600))
	if _, err := idem.Do(ctx, g, kt, func(context.Context) (withTime, error) { return withTime{At: at, ID: "x"}, nil }); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		v, err := idem.Do(ctx, g, kt, func(context.Context) (withTime, error) { return withTime{}, nil })
		if err != nil || !v.At.Equal(at) || v.ID != "x" {
			t.Fatalf("replay = %+v, %v", v, err)
		}
	}
}

// A remembered value is handed out only to a caller of its own type: a
// caller asking for an interface the value satisfies decodes the JSON for
// itself, as it would without the remembered values.
func TestDoReplayAsAnInterfaceDecodes(t *testing.T) {
	g, _ := newGuard(t, idem.Config{})
	ctx := context.Background()
	k := idem.Key{Scope: "test", ID: "interface"}
	if _, err := idem.Do(ctx, g, k, func(context.Context) (counted, error) { return counted{N: 3}, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, g, k, func(context.Context) (counted, error) { return counted{}, nil }); err != nil {
		t.Fatal(err) // remembers counted{3}
	}
	v, err := idem.Do(ctx, g, k, func(context.Context) (any, error) { return nil, nil })
	if m, ok := v.(map[string]any); err != nil || !ok || m["N"] != float64(3) {
		t.Fatalf("replay as any = %#v, %v; want the decoded JSON object", v, err)
	}
}

// A replay of a remembered value allocates no more than Guard.Run's replay.
func TestDoReplayAllocations(t *testing.T) {
	if raceDetector {
		t.Skip("allocation counts differ under the race detector")
	}
	type payment struct {
		ID     string
		Amount int64
	}
	g, _ := newGuard(t, idem.Config{})
	ctx := context.Background()
	k := idem.Key{Scope: "test", ID: "replay-allocs"}
	if _, err := idem.Do(ctx, g, k, func(context.Context) (payment, error) { return payment{"P", 1}, nil }); err != nil {
		t.Fatal(err)
	}
	run := testing.AllocsPerRun(200, func() {
		if res, err := g.Run(ctx, k, nil, func(context.Context, uint64) ([]byte, error) { return nil, nil }); err != nil || res.Outcome != store.Replayed {
			t.Fatal(res.Outcome, err)
		}
	})
	do := testing.AllocsPerRun(200, func() {
		if p, err := idem.Do(ctx, g, k, func(context.Context) (payment, error) { return payment{}, nil }); err != nil || p.Amount != 1 {
			t.Fatal(p, err)
		}
	})
	if do > run {
		t.Fatalf("idem.Do replay allocates %.1f times, Guard.Run replay %.1f", do, run)
	}
}

// A replay that misses the decoded-value cache — replays cycling through
// more keys than it has slots — allocates no more than Guard.Run's replay
// and the decoding: the cache takes a key in only once it repeats.
func TestDoReplayMissAllocations(t *testing.T) {
	if raceDetector {
		t.Skip("allocation counts differ under the race detector")
	}
	type payment struct {
		ID     string
		Amount int64
	}
	g, _ := newGuard(t, idem.Config{})
	ctx := context.Background()
	const keys = 4096
	key := func(i int) idem.Key { return idem.Key{Scope: "test", ID: "miss-" + strconv.Itoa(i%keys)} }
	ids := make([]idem.Key, keys)
	for i := range keys {
		ids[i] = key(i)
		if _, err := idem.Do(ctx, g, ids[i], func(context.Context) (payment, error) { return payment{"P", int64(i)}, nil }); err != nil {
			t.Fatal(err)
		}
	}
	i := 0
	run := testing.AllocsPerRun(keys, func() {
		i++
		if res, err := g.Run(ctx, ids[i%keys], nil, func(context.Context, uint64) ([]byte, error) { return nil, nil }); err != nil || res.Outcome != store.Replayed {
			t.Fatal(res.Outcome, err)
		}
	})
	stored := []byte(`{"ID":"P","Amount":7}`)
	decode := testing.AllocsPerRun(keys, func() {
		var p payment
		if err := json.Unmarshal(stored, &p); err != nil {
			t.Fatal(err)
		}
	})
	do := testing.AllocsPerRun(keys, func() {
		i++
		if _, err := idem.Do(ctx, g, ids[i%keys], func(context.Context) (payment, error) { return payment{}, nil }); err != nil {
			t.Fatal(err)
		}
	})
	if do > run+decode {
		t.Fatalf("a missing idem.Do replay allocates %.1f times; Guard.Run's replay %.1f and the decoding %.1f", do, run, decode)
	}
}
