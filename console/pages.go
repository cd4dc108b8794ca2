package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/store"
)

// --- overview ---

type stateCount struct {
	State string
	Count int64
}

type overviewData struct {
	Chart        *chart
	ChartTitle   string
	States       []stateCount
	StatesNote   string
	Outbox       []stateCount
	OldestAge    string
	OutboxStatus error
	// StatesError and OutboxError say why a panel has nothing to show.
	StatesError, OutboxError string
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var d overviewData
	if c.cfg.History != nil {
		d.Chart = newChart(c.cfg.History.LastHour())
		d.ChartTitle = c.cfg.HistoryTitle
		if d.ChartTitle == "" {
			d.ChartTitle = "Outcomes"
		}
	}
	if c.cfg.Store != nil {
		if sc, ok := c.cfg.Store.(store.StateCounter); ok {
			counts, err := sc.CountStates(ctx)
			if err != nil {
				d.StatesError = c.describe(err)
			}
			for _, st := range []store.State{store.StateInFlight, store.StateCompleted, store.StateFailed, store.StateReleased, store.StatePoisoned} {
				d.States = append(d.States, stateCount{st.String(), counts[st]})
			}
		} else {
			d.StatesNote = "This store keeps no count by state (Redis keeps no index); browse the keys instead."
		}
	}
	if c.cfg.Outbox != nil {
		st, err := c.cfg.Outbox.Stats(ctx)
		var counts map[outbox.Status]int64
		if err == nil {
			counts, err = c.cfg.Outbox.CountByStatus(ctx)
		}
		if err != nil {
			d.OutboxError = c.describe(err)
		} else {
			for _, s := range []outbox.Status{outbox.Pending, outbox.Sent, outbox.Acked, outbox.Dead, outbox.Skipped} {
				d.Outbox = append(d.Outbox, stateCount{string(s), counts[s]})
			}
			if !st.OldestPending.IsZero() {
				d.OldestAge = humanDuration(c.cfg.Now().Sub(st.OldestPending))
			}
		}
	}
	c.render(w, r, "overview", "Overview", d)
}

// --- keys ---

type keysData struct {
	Scope, Prefix, State string
	Records              []recordView
	Next                 string // the after= of the next page
	Note                 string
}

type recordView struct {
	store.Record
	Display   string
	LeaseLeft string
}

func (c *Console) keys(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := keysData{Scope: q.Get("scope"), Prefix: q.Get("prefix"), State: q.Get("state")}
	lister, ok := c.cfg.Store.(store.Lister)
	if c.cfg.Store == nil || !ok {
		d.Note = "This console has no store that lists its keys; use Find with a key."
		c.render(w, r, "keys", "Keys", d)
		return
	}
	var want store.State
	if d.State != "" {
		var err error
		if want, err = store.ParseState(d.State); err != nil {
			c.render(w, r, "keys", "Keys", err)
			return
		}
	}
	// Raw storage keys are scope, 0x1F, id: a scope and an id prefix make
	// a key prefix, and the walk starts just before it.
	prefix := d.Prefix
	if d.Scope != "" {
		prefix = idem.Key{Scope: d.Scope, ID: d.Prefix}.Storage(false)
	}
	after := q.Get("after")
	if after == "" && prefix != "" {
		after = prefix[:len(prefix)-1] + string(prefix[len(prefix)-1]-1) + "\U0010FFFF"
		if prefix[len(prefix)-1] == 0 {
			after = ""
		}
	}
	// Read pages until one page of matches is full (a state filter may
	// skip many), at most 20 store pages per request.
	for range 20 {
		recs, err := lister.List(r.Context(), after, c.cfg.PageSize)
		if err != nil {
			c.render(w, r, "keys", "Keys", err)
			return
		}
		done := len(recs) < c.cfg.PageSize
		for _, rec := range recs {
			after = rec.Key
			if prefix != "" && !strings.HasPrefix(rec.Key, prefix) {
				if rec.Key > prefix {
					done = true
					break
				}
				continue
			}
			if want != 0 && rec.State != want {
				continue
			}
			v := recordView{Record: rec, Display: store.DisplayKey(rec.Key)}
			if rec.State == store.StateInFlight {
				v.LeaseLeft = humanDuration(rec.LeaseUntil.Sub(c.cfg.Now()))
			}
			d.Records = append(d.Records, v)
		}
		if done {
			after = ""
			break
		}
		if len(d.Records) >= c.cfg.PageSize {
			break
		}
	}
	d.Next = after
	c.render(w, r, "keys", "Keys", d)
}

type confirmData struct {
	Action, Key, Display, Question, Back string
	Record                               *store.Record
}

// forget deletes a record after a confirmation page (readable without
// JavaScript): the first POST asks, the one with confirm=yes deletes.
// Releasing a poisoned key is the same deletion: its next delivery starts
// a new generation.
func (c *Console) forget(w http.ResponseWriter, r *http.Request) {
	key := r.PostFormValue("key")
	if c.cfg.Store == nil || key == "" {
		http.Error(w, "no store or no key", http.StatusBadRequest)
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		d := confirmData{Action: "/keys/forget", Key: key, Display: store.DisplayKey(key), Back: "/keys",
			Question: "Forget this key? Its next delivery runs the work again."}
		if rec, err := c.cfg.Store.Get(r.Context(), key); err == nil {
			d.Record = &rec
			if rec.State == store.StatePoisoned {
				d.Question = "Release this poisoned key? Its record is removed and its next delivery runs the work again."
			}
		}
		c.render(w, r, "confirm", "Confirm", d)
		return
	}
	if err := c.cfg.Store.Delete(r.Context(), key); err != nil {
		c.render(w, r, "message", "Error", err)
		return
	}
	http.Redirect(w, r, "/keys?done="+url.QueryEscape("forgot "+store.DisplayKey(key)), http.StatusSeeOther)
}

// --- outbox ---

type outboxData struct {
	Status, Dest string
	Rows         []outbox.Row
	Next         int64
	Note         string
}

func (c *Console) outboxList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := outboxData{Status: q.Get("status"), Dest: q.Get("dest")}
	if c.cfg.Outbox == nil {
		d.Note = "This console has no outbox."
		c.render(w, r, "outbox", "Outbox", d)
		return
	}
	var st outbox.Status
	if d.Status != "" {
		var err error
		if st, err = outbox.ParseStatus(d.Status); err != nil {
			c.render(w, r, "outbox", "Outbox", err)
			return
		}
	}
	after, _ := strconv.ParseInt(q.Get("after"), 10, 64)
	// One row more than a page tells whether a next page exists.
	rows, err := c.cfg.Outbox.ListTo(r.Context(), st, d.Dest, after, c.cfg.PageSize+1)
	if err != nil {
		c.render(w, r, "outbox", "Outbox", err)
		return
	}
	if len(rows) > c.cfg.PageSize {
		rows = rows[:c.cfg.PageSize]
		d.Next = rows[len(rows)-1].ID
	}
	d.Rows = rows
	c.render(w, r, "outbox", "Outbox", d)
}

type rowData struct {
	Row     outbox.Row
	Headers []string
	Record  *store.Record
}

func (c *Console) outboxRow(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Outbox == nil {
		http.NotFound(w, r)
		return
	}
	row, err := c.cfg.Outbox.Get(r.Context(), r.URL.Query().Get("key"))
	if err != nil {
		c.render(w, r, "message", "Not found", err)
		return
	}
	d := rowData{Row: row}
	for k, v := range row.Headers {
		d.Headers = append(d.Headers, k+": "+outbox.RedactHeader(k, v))
	}
	slices.Sort(d.Headers)
	if c.cfg.Store != nil {
		if rec, err := c.cfg.Store.Get(r.Context(), row.Key); err == nil {
			d.Record = &rec
		}
	}
	c.render(w, r, "row", "Message "+row.Key, d)
}

func (c *Console) retry(w http.ResponseWriter, r *http.Request) {
	c.rowAction(w, r, "retrying", func(ctx context.Context, key string) error { return c.cfg.Outbox.Retry(ctx, key) })
}

// skip gives up on a dead row: the later rows of its ordering key go on.
func (c *Console) skip(w http.ResponseWriter, r *http.Request) {
	c.rowAction(w, r, "skipped", func(ctx context.Context, key string) error { return c.cfg.Outbox.Skip(ctx, key) })
}

// rowAction runs act on the form's key and goes back to the page the form
// names, saying done.
func (c *Console) rowAction(w http.ResponseWriter, r *http.Request, done string, act func(ctx context.Context, key string) error) {
	key := r.PostFormValue("key")
	if c.cfg.Outbox == nil || key == "" {
		http.Error(w, "no outbox or no key", http.StatusBadRequest)
		return
	}
	if err := act(r.Context(), key); err != nil {
		c.render(w, r, "message", "Error", err)
		return
	}
	back := r.PostFormValue("back")
	if !strings.HasPrefix(back, "/outbox") {
		back = "/outbox"
	}
	sep := "?"
	if strings.Contains(back, "?") {
		sep = "&"
	}
	http.Redirect(w, r, back+sep+"done="+url.QueryEscape(done+" "+key), http.StatusSeeOther)
}

// retryDead moves every dead row of a destination prefix back to pending.
func (c *Console) retryDead(w http.ResponseWriter, r *http.Request) {
	dest := r.PostFormValue("dest")
	if c.cfg.Outbox == nil || dest == "" {
		http.Error(w, "no outbox or no destination", http.StatusBadRequest)
		return
	}
	n, after := 0, int64(0)
	for {
		rows, err := c.cfg.Outbox.ListTo(r.Context(), outbox.Dead, dest, after, 500)
		if err != nil {
			c.render(w, r, "message", "Error", err)
			return
		}
		for _, row := range rows {
			if err := c.cfg.Outbox.Retry(r.Context(), row.Key); err == nil {
				n++
			} else if !errors.Is(err, outbox.ErrNotFound) {
				c.render(w, r, "message", "Error", err)
				return
			}
			after = row.ID
		}
		if len(rows) < 500 {
			break
		}
	}
	http.Redirect(w, r, "/outbox?status=dead&dest="+url.QueryEscape(dest)+"&done="+url.QueryEscape(fmt.Sprintf("retrying %d dead messages to %s", n, dest)), http.StatusSeeOther)
}

// --- find ---

type findData struct {
	Query   string
	Records []recordView
	Rows    []outbox.Row
	Inbox   []inbox.Row
	Errors  []string
}

// find shows everything known of a key: the idempotency record (the query
// as a raw storage key, or as scope/id), the outbox row, the inbox rows.
func (c *Console) find(w http.ResponseWriter, r *http.Request) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	d := findData{Query: q}
	if q == "" {
		c.render(w, r, "find", "Find an intent", d)
		return
	}
	ctx := r.Context()
	if c.cfg.Store != nil {
		candidates := []string{q}
		if scope, id, ok := strings.Cut(q, "/"); ok {
			candidates = append(candidates, idem.Key{Scope: scope, ID: id}.Storage(false), idem.Key{Scope: scope, ID: id}.Storage(true))
		}
		seen := map[string]bool{}
		for _, k := range candidates {
			if seen[k] || store.ValidateKey(k) != nil {
				continue
			}
			seen[k] = true
			rec, err := c.cfg.Store.Get(ctx, k)
			switch {
			case err == nil:
				d.Records = append(d.Records, recordView{Record: rec, Display: store.DisplayKey(rec.Key)})
			case !errors.Is(err, store.ErrNotFound):
				d.Errors = append(d.Errors, c.describe(err))
			}
		}
	}
	if c.cfg.Outbox != nil {
		if row, err := c.cfg.Outbox.Get(ctx, q); err == nil {
			d.Rows = append(d.Rows, row)
		} else if !errors.Is(err, outbox.ErrNotFound) {
			d.Errors = append(d.Errors, c.describe(err))
		}
	}
	if c.cfg.Inbox != nil {
		rows, err := c.cfg.Inbox.Find(ctx, q)
		if err != nil {
			d.Errors = append(d.Errors, c.describe(err))
		}
		d.Inbox = rows
	}
	c.render(w, r, "find", "Find "+q, d)
}
