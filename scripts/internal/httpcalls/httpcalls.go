// Package httpcalls counts the AWS API calls a benchmark makes.
package httpcalls

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Counter is an http.RoundTripper that counts the AWS API calls made
// through it, by operation (the X-Amz-Target header, its service prefix
// cut).
type Counter struct {
	Next   http.RoundTripper
	mu     sync.Mutex
	counts map[string]int
}

// NewCounter counts the calls made through next.
func NewCounter(next http.RoundTripper) *Counter {
	return &Counter{Next: next, counts: map[string]int{}}
}

// RoundTrip implements http.RoundTripper.
func (c *Counter) RoundTrip(r *http.Request) (*http.Response, error) {
	op := r.Header.Get("X-Amz-Target")[strings.IndexByte(r.Header.Get("X-Amz-Target"), '.')+1:]
	c.mu.Lock()
	c.counts[op]++
	c.mu.Unlock()
	return c.Next.RoundTrip(r)
}

// Reset forgets the counts.
func (c *Counter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.counts)
}

// Per formats the calls made since the last Reset per message.
func (c *Counter) Per(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ops []string
	for op := range c.counts {
		ops = append(ops, op)
	}
	slices.Sort(ops)
	var parts []string
	for _, op := range ops {
		parts = append(parts, fmt.Sprintf("%s %.2f", op, float64(c.counts[op])/float64(n)))
	}
	return strings.Join(parts, ", ")
}
