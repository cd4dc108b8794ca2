package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/idemgo/idem/store"
	"hash/maphash"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
)

type fenceKey struct{}

// FenceFrom returns the fencing token of the guarded call running in ctx
// (the context Guard.Run hands its work, and Do its fn), so a business write
// can be conditioned on it.
func FenceFrom(ctx context.Context) (uint64, bool) {
	f, ok := ctx.Value(fenceKey{}).(uint64)
	return f, ok
}

// Do runs fn at most once for key and returns its result, JSON-encoded in the
// store and decoded for duplicates:
//
//	booking, err := idem.Do(ctx, guard, key, func(ctx context.Context) (Booking, error) { … })
//
// A duplicate of a completed call returns the stored result without running
// fn. The errors are ErrInProgress (another owner is running it: retry
// later), ErrFingerprintMismatch, ErrPoisoned, a *ReplayedFailure (the first
// run failed definitely), fn's own error, or a store failure (fn did not run).
//
// When T holds no references (no pointer, slice, map, interface, channel or
// function, time.Time allowed), a value decoded from a stored result is
// remembered by the Guard and handed out again, as a copy, to the
// duplicates that replay the same bytes: a hot duplicate costs no decoding.
func Do[T any](ctx context.Context, g *Guard, key Key, fn func(context.Context) (T, error)) (T, error) {
	return DoWith(ctx, g, key, nil, fn)
}

// DoWith is Do with per-call options (a request fingerprint).
func DoWith[T any](ctx context.Context, g *Guard, key Key, opts *RunOptions, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	var out T
	res, err := g.Run(ctx, key, opts, func(ctx context.Context, fence uint64) ([]byte, error) {
		v, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		out = v
		b, err := json.Marshal(v)
		if err != nil {
			return nil, Permanent(fmt.Errorf("idem: encode result: %w", err))
		}
		return b, nil
	})
	if err != nil {
		return zero, err
	}
	switch res.Outcome {
	case store.Acquired, store.TakenOver:
		return out, nil
	case store.Replayed:
		if res.Failed {
			return zero, &ReplayedFailure{Message: string(res.Value)}
		}
		return decodeStored[T](g, key, res)
	case store.InProgress:
		return zero, ErrInProgress
	case store.Mismatch:
		return zero, ErrFingerprintMismatch
	case store.Poisoned:
		return zero, ErrPoisoned
	}
	return zero, fmt.Errorf("idem: unexpected outcome %v", res.Outcome)
}

// decodeStored decodes a replayed result, or hands out the copy decoded the
// last time the same key replayed the same bytes.
func decodeStored[T any](g *Guard, key Key, res Result) (T, error) {
	// Only a value of a copyable type is ever remembered, and a hit must be
	// of T itself (not merely assignable to an interface T), so a hit needs
	// no copyable check; out is declared after it, so a hit allocates nothing.
	typ := reflect.TypeFor[T]()
	slot := g.decoded.slot(res.Record.Key)
	if v, ok := slot.get(typ, res.Record.Key, res.Value).(T); ok {
		return v, nil
	}
	var out T
	if err := json.Unmarshal(res.Value, &out); err != nil {
		var zero T
		return zero, fmt.Errorf("idem: decode stored result of %s: %w", key, err)
	}
	// admit before copyable: replays cycling through many keys are mostly
	// not admitted, and then need no look-up of the type.
	if res.Record.Key != "" && slot.admit() && copyable(typ) {
		slot.put(typ, res.Record.Key, res.Value, out)
	}
	return out, nil
}

// decodedValues remembers one decoded result per slot (a key hashes to its
// slot; a newer key takes the slot over), so its memory is bounded whatever
// the number of keys. Entries are immutable: a reader compares the key and
// the bytes, so a value is only ever handed out for exactly the bytes it was
// decoded from. A key is taken in only when it misses twice in a row in its
// slot (admit): replays cycling through more keys than there are slots
// would otherwise evict each other on every call, paying for an entry each
// time and never reusing one.
type decodedValues struct {
	once  sync.Once
	seed  maphash.Seed
	slots []decodedSlot
}

// decodedSlot is one slot: its entry, and the tag of the key that missed
// in it last.
type decodedSlot struct {
	entry  atomic.Pointer[decodedValue]
	missed atomic.Uint64
}

type decodedValue struct {
	typ   reflect.Type
	key   string
	raw   []byte
	value any
}

const decodedSlots = 1024

// slot returns the slot of key, hashing it once for the whole call.
func (d *decodedValues) slot(key string) slotRef {
	d.once.Do(func() {
		d.seed = maphash.MakeSeed()
		d.slots = make([]decodedSlot, decodedSlots)
	})
	h := maphash.String(d.seed, key)
	return slotRef{s: &d.slots[h%decodedSlots], tag: h | 1} // never 0, an empty slot's value
}

// slotRef is a key's slot and its tag.
type slotRef struct {
	s   *decodedSlot
	tag uint64
}

// get returns the value decoded from raw for key, if the slot holds it.
func (r slotRef) get(typ reflect.Type, key string, raw []byte) any {
	if e := r.s.entry.Load(); e != nil && e.typ == typ && e.key == key && bytes.Equal(e.raw, raw) {
		return e.value
	}
	return nil
}

// admit records a miss of the key and reports whether it is the second in
// a row in its slot: whether the key is worth an entry.
func (r slotRef) admit() bool { return r.s.missed.Swap(r.tag) == r.tag }

func (r slotRef) put(typ reflect.Type, key string, raw []byte, value any) {
	r.s.entry.Store(&decodedValue{typ: typ, key: key, raw: bytes.Clone(raw), value: value})
}

var copyableTypes sync.Map // reflect.Type → bool

// copyable reports whether a value of t can be copied and handed to two
// callers without them sharing anything mutable.
func copyable(t reflect.Type) bool {
	if v, ok := copyableTypes.Load(t); ok {
		return v.(bool)
	}
	ok := copyableKind(t, 0)
	copyableTypes.Store(t, ok)
	return ok
}

func copyableKind(t reflect.Type, depth int) bool {
	if depth > 32 {
		return false
	}
	if t == reflect.TypeFor[time.Time]() {
		return true // its *Location is immutable
	}
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128, reflect.String:
		return true
	case reflect.Array:
		return copyableKind(t.Elem(), depth+1)
	case reflect.Struct:
		for i := range t.NumField() {
			if !copyableKind(t.Field(i).Type, depth+1) {
				return false
			}
		}
		return true
	}
	return false
}
