package console

import (
	"sort"
	"sync"
	"time"
)

// History counts a process's outcomes per minute over the last hour, for
// the console's chart: idem serve records its requests' outcomes
// (executed, replayed, conflict…), idem relay its sends' (acked, sent,
// pending, dead). It is safe for concurrent use; Add is a map increment
// under a mutex.
type History struct {
	mu      sync.Mutex
	now     func() time.Time
	minutes [60]minute
}

type minute struct {
	at     int64 // Unix minute
	counts map[string]int64
}

// NewHistory returns an empty history on the wall clock (nil: time.Now).
func NewHistory(now func() time.Time) *History {
	if now == nil {
		now = time.Now
	}
	return &History{now: now}
}

// Add counts one outcome in the current minute.
func (h *History) Add(outcome string) {
	m := h.now().Unix() / 60
	h.mu.Lock()
	b := &h.minutes[m%60]
	if b.at != m {
		b.at, b.counts = m, map[string]int64{}
	}
	b.counts[outcome]++
	h.mu.Unlock()
}

// Minute is one minute of a History.
type Minute struct {
	Start  time.Time
	Counts map[string]int64
}

// LastHour returns the last 60 minutes, oldest first (empty minutes
// included), and the outcomes seen, sorted.
func (h *History) LastHour() ([]Minute, []string) {
	cur := h.now().Unix() / 60
	out := make([]Minute, 60)
	seen := map[string]bool{}
	h.mu.Lock()
	for i := range out {
		m := cur - 59 + int64(i)
		out[i] = Minute{Start: time.Unix(m*60, 0), Counts: map[string]int64{}}
		if b := h.minutes[m%60]; b.at == m {
			for k, v := range b.counts {
				out[i].Counts[k] = v
				seen[k] = true
			}
		}
	}
	h.mu.Unlock()
	names := make([]string, 0, len(seen))
	for k := range seen {
		names = append(names, k)
	}
	sort.Strings(names)
	return out, names
}

// chart is the overview's bar chart of a History: one stacked bar per
// minute, drawn on the server as SVG (no script needed).
type chart struct {
	Width, Height int
	Bars          []bar
	Legend        []legendItem
	Max           int64
	Total         int64
}

type bar struct {
	X, Width    float64
	Segments    []segment
	Title       string
	TotalHeight float64
}

type segment struct {
	Y, Height float64
	Class     string
}

type legendItem struct {
	Name, Class string
	Count       int64
}

// outcomeClass maps an outcome to a colour class (good, part-done, replay,
// wait, bad, other).
func outcomeClass(o string) string {
	switch o {
	case "executed", "acked", "processed":
		return "c-good"
	case "sent": // delivered, its receipt still to come: not the colour of acked
		return "c-part"
	case "replayed", "duplicate":
		return "c-replay"
	case "conflict", "pending", "in-progress":
		return "c-wait"
	case "mismatch", "rejected", "unavailable", "dead", "error":
		return "c-bad"
	}
	return "c-other"
}

func newChart(minutes []Minute, names []string) *chart {
	c := &chart{Width: 720, Height: 140}
	for _, m := range minutes {
		var t int64
		for _, v := range m.Counts {
			t += v
		}
		c.Max = max(c.Max, t)
		c.Total += t
	}
	totals := map[string]int64{}
	barW := float64(c.Width) / float64(len(minutes))
	for i, m := range minutes {
		b := bar{X: float64(i) * barW, Width: barW - 1}
		y := float64(c.Height)
		var parts []string
		for _, n := range names {
			v := m.Counts[n]
			totals[n] += v
			if v == 0 || c.Max == 0 {
				continue
			}
			h := float64(v) / float64(c.Max) * float64(c.Height)
			y -= h
			b.Segments = append(b.Segments, segment{Y: y, Height: h, Class: outcomeClass(n)})
			parts = append(parts, n+" "+itoa(v))
		}
		b.Title = m.Start.UTC().Format("15:04")
		if len(parts) > 0 {
			b.Title += ": " + joinComma(parts)
		}
		c.Bars = append(c.Bars, b)
	}
	for _, n := range names {
		c.Legend = append(c.Legend, legendItem{Name: n, Class: outcomeClass(n), Count: totals[n]})
	}
	return c
}

func itoa(v int64) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}

func joinComma(parts []string) string {
	out := ""
	for i, p := range parts {
		if i > 0 {
			out += ", "
		}
		out += p
	}
	return out
}
