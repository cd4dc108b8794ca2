package idem

import (
	"bytes"
	"github.com/idemgo/idem/store"
	"sync"
	"time"
)

// cache holds settled (completed or failed) records in process, in front of
// the store, so a hot duplicate costs no round trip. It is bounded; when full
// it evicts an arbitrary entry. Entries live at most ttl and never past the
// record's own expiry.
type cache struct {
	mu      sync.Mutex
	max     int
	ttl     time.Duration
	entries map[string]cacheEntry
}

type cacheEntry struct {
	rec   store.Record
	until time.Time
}

func newCache(max int, ttl time.Duration) *cache {
	return &cache{max: max, ttl: ttl, entries: make(map[string]cacheEntry, max)}
}

func (c *cache) get(key string, now time.Time) (store.Record, bool) {
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok && !now.Before(e.until) {
		delete(c.entries, key)
		ok = false
	}
	c.mu.Unlock()
	return e.rec, ok
}

func (c *cache) put(rec store.Record, now time.Time) {
	until := now.Add(c.ttl)
	if !rec.ExpiresAt.IsZero() && rec.ExpiresAt.Before(until) {
		until = rec.ExpiresAt
	}
	if !now.Before(until) {
		return
	}
	rec.Result = bytes.Clone(rec.Result) // its own: the caller keeps the bytes it was given
	c.mu.Lock()
	if _, ok := c.entries[rec.Key]; !ok && len(c.entries) >= c.max {
		for k := range c.entries {
			delete(c.entries, k)
			break
		}
	}
	c.entries[rec.Key] = cacheEntry{rec: rec, until: until}
	c.mu.Unlock()
}

func (c *cache) remove(key string) {
	c.mu.Lock()
	delete(c.entries, key)
	c.mu.Unlock()
}
