package e2e_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The campaign's trail: what each relay's sender answered for each send,
// what each consumer decided for each delivery, and the broker's queue
// depth and crashes through the run — so that a lost transfer is reported
// with where it was last seen.

// trailLog is a helper process's log of its sends or decisions: one line
// per event, written whole (a kill loses whole lines only).
type trailLog struct {
	mu sync.Mutex
	f  *os.File
}

func openTrail(t testing.TB, dir, name string) *trailLog {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return &trailLog{f: f}
}

// add logs one event of key: what happened, and the detail (an error, a
// reason).
func (l *trailLog) add(proc int, key, what, detail string) {
	detail, _, _ = strings.Cut(strings.ReplaceAll(detail, "\t", " "), "\n")
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = fmt.Fprintf(l.f, "%d\t%d\t%s\t%s\t%s\n", time.Now().UnixNano(), proc, key, what, detail)
}

// event is one line of a trail log.
type event struct {
	at           int64
	proc         int
	key          string
	what, detail string
}

func (e event) String() string {
	return fmt.Sprintf("%s proc %d %s %s", time.Unix(0, e.at).Format("15:04:05.000"), e.proc, e.what, e.detail)
}

// readTrail reads every trail log in dir matching pattern.
func readTrail(dir, pattern string) []event {
	names, _ := filepath.Glob(filepath.Join(dir, pattern))
	var events []event
	for _, name := range names {
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		for sc := bufio.NewScanner(f); sc.Scan(); {
			fields := strings.SplitN(sc.Text(), "\t", 5)
			if len(fields) != 5 {
				continue // a line cut by a kill
			}
			at, _ := strconv.ParseInt(fields[0], 10, 64)
			proc, _ := strconv.Atoi(fields[1])
			events = append(events, event{at, proc, fields[2], fields[3], fields[4]})
		}
		f.Close()
	}
	sort.Slice(events, func(i, j int) bool { return events[i].at < events[j].at })
	return events
}

// depthSample is the broker's view of the queue at one moment.
type depthSample struct {
	at        int64
	ready     int
	consumers int
	err       error
}

// brokerHistory is what the campaign saw of the broker: queue depths every
// half second and the crashes' spans.
type brokerHistory struct {
	mu      sync.Mutex
	depths  []depthSample
	crashes [][2]int64
}

func (h *brokerHistory) sample(s depthSample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.depths = append(h.depths, s)
}

func (h *brokerHistory) crashed(from, to int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.crashes = append(h.crashes, [2]int64{from, to})
}

// around describes the broker from 5 s before to 5 s after at.
func (h *brokerHistory) around(at int64) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	from, to := at-int64(5*time.Second), at+int64(5*time.Second)
	for _, c := range h.crashes {
		if c[1] >= from && c[0] <= to {
			fmt.Fprintf(&b, " broker crashed %s–%s;", time.Unix(0, c[0]).Format("15:04:05.000"), time.Unix(0, c[1]).Format("15:04:05.000"))
		}
	}
	var depths []string
	for _, d := range h.depths {
		if d.at >= from && d.at <= to {
			if d.err != nil {
				depths = append(depths, time.Unix(0, d.at).Format("05.0")+" ?")
			} else {
				depths = append(depths, fmt.Sprintf("%s %d/%dc", time.Unix(0, d.at).Format("05.0"), d.ready, d.consumers))
			}
		}
	}
	if len(depths) > 0 {
		fmt.Fprintf(&b, " queue (s ready/consumers): %s", strings.Join(depths, " "))
	}
	return b.String()
}

// reportLost prints, for each lost key (the first 20), every send of it
// the relays logged, every decision of it the consumers logged, and the
// broker around its last send.
func reportLost(t *testing.T, dir string, lost []string, broker *brokerHistory) {
	if len(lost) == 0 {
		return
	}
	want := map[string]bool{}
	for _, k := range lost[:min(20, len(lost))] {
		want[k] = true
	}
	byKey := map[string][]event{}
	for _, e := range append(readTrail(dir, "sends-*.log"), readTrail(dir, "decisions-*.log")...) {
		if want[e.key] {
			byKey[e.key] = append(byKey[e.key], e)
		}
	}
	for _, k := range lost[:min(20, len(lost))] {
		es := byKey[k]
		sort.Slice(es, func(i, j int) bool { return es[i].at < es[j].at })
		var last int64
		var lines []string
		for _, e := range es {
			lines = append(lines, e.String())
			if strings.HasPrefix(e.what, "send") {
				last = e.at
			}
		}
		where := "never sent by a relay"
		if last != 0 {
			where = "last sent " + time.Unix(0, last).Format("15:04:05.000") + ";" + broker.around(last)
		}
		t.Logf("lost %s: %s\n\t%s", k, where, strings.Join(lines, "\n\t"))
	}
}
