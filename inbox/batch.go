package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/idemgo/idem/sqldriver"
)

// MaxBatch bounds the items of one ProcessBatch call.
const MaxBatch = 1000

// BatchItem is one message of a batch.
type BatchItem[TTx any] struct {
	Event Event
	// Fn makes the message's business change in tx. It runs only for a new
	// key, under the item's own savepoint.
	Fn func(ctx context.Context, tx TTx) error
}

// BatchResult is what ProcessBatch did with one item.
type BatchResult struct {
	// Outcome is Processed, Duplicate or Stale when Err is nil; each is
	// acknowledged.
	Outcome Outcome
	// Err is the item's own failure (an invalid event, Fn's error, or an
	// earlier copy of the same key in the batch that failed): nothing of it
	// committed; redeliver it.
	Err error
}

// RunBatch runs a broker's batch of messages (of the adapter's type M) in
// one ProcessBatch: event gives each message's Event, process makes its
// change in tx. The results are in the order of msgs.
func RunBatch[TTx, M any](ctx context.Context, ib *Inbox[TTx], msgs []M, event func(M) Event, process func(ctx context.Context, tx TTx, m M) error) ([]BatchResult, error) {
	items := make([]BatchItem[TTx], len(msgs))
	for n, m := range msgs {
		items[n] = BatchItem[TTx]{Event: event(m), Fn: func(ctx context.Context, tx TTx) error { return process(ctx, tx, m) }}
	}
	return ib.ProcessBatch(ctx, items)
}

// ErrEarlierCopyFailed is the Err of an item whose key an earlier item of
// the same batch claimed and then failed: it is redelivered, like that one.
var ErrEarlierCopyFailed = errors.New("idem/inbox: an earlier copy of this key in the batch failed")

// ProcessBatch runs a batch of messages in one transaction, so they share
// one commit: one statement claims every key, each new item's Fn runs under
// a savepoint, and the transaction commits once. An item whose Fn fails is
// rolled back to its savepoint and its claim removed — it alone is to be
// redelivered (its BatchResult.Err); the others commit.
//
// The error is non-nil when the batch as a whole failed (begin, the claim
// statement, a savepoint or the commit): nothing committed, redeliver every
// item. Each item's Fn should change only the database: a batch that fails
// as a whole runs again, Fn included.
//
// On PostgreSQL each item that writes is a subtransaction; keep batches at
// most 64 items, or the backend's subtransaction cache overflows and every
// other session's snapshot checks slow down.
//
// The keys are claimed in one order, so batches never deadlock on them; the
// items' own changes can: a batch holds the locks of every row its items
// changed until it commits, so items that update shared rows (a balance)
// queue the batches behind one another, and deadlock them when two take
// those rows in different orders (the database aborts one: its error is
// the batch's, and every item is redelivered). Batch messages whose rows
// seldom overlap.
func (i *Inbox[TTx]) ProcessBatch(ctx context.Context, items []BatchItem[TTx]) ([]BatchResult, error) {
	if len(items) > MaxBatch {
		return nil, fmt.Errorf("idem/inbox: a batch of %d items; at most %d", len(items), MaxBatch)
	}
	results := make([]BatchResult, len(items))
	valid := make([]int, 0, len(items))
	for n, it := range items {
		if err := it.Event.validate(); err != nil {
			results[n].Err = err
			continue
		}
		valid = append(valid, n)
	}
	if len(valid) == 0 {
		return results, nil
	}
	tx, err := i.driver.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("idem/inbox: begin: %w", err)
	}
	defer i.driver.Rollback(context.WithoutCancel(ctx), tx)
	ex := i.driver.UnwrapExecutor(tx)
	claimed, err := i.claimAll(ctx, ex, items, valid)
	if err != nil {
		return nil, err
	}
	claimant := make(map[string]int, len(claimed)) // key → the item that claimed it
	for _, n := range valid {
		ev := items[n].Event
		k := batchKey(ev.Consumer, ev.CorrelationID)
		if !claimed[k] {
			results[n].Outcome = Duplicate
			continue
		}
		if first, ok := claimant[k]; ok {
			if results[first].Err != nil {
				results[n].Err = ErrEarlierCopyFailed
			} else {
				results[n].Outcome = Duplicate
			}
			continue
		}
		claimant[k] = n
		if err := i.runItem(ctx, tx, ex, items[n], &results[n]); err != nil {
			return nil, err
		}
	}
	if err := i.driver.Commit(ctx, tx); err != nil {
		return nil, fmt.Errorf("idem/inbox: commit: %w", err)
	}
	return results, nil
}

// runItem runs one claimed item under a savepoint. Its own failure goes to
// res; the error is the transaction's (the batch fails).
func (i *Inbox[TTx]) runItem(ctx context.Context, tx TTx, ex sqldriver.Executor, it BatchItem[TTx], res *BatchResult) error {
	// One savepoint name for every item: each SAVEPOINT stacks a new one, and
	// ROLLBACK TO goes back to the latest, so no RELEASE is needed.
	if _, err := ex.Exec(ctx, "SAVEPOINT idem_inbox_item"); err != nil {
		return fmt.Errorf("idem/inbox: savepoint: %w", err)
	}
	res.Outcome = Processed
	var err error
	if ev := it.Event; ev.Entity != "" {
		var fresh bool
		if fresh, err = i.applyVersion(ctx, ex, ev.Entity, ev.Version); err == nil && !fresh {
			res.Outcome = Stale
		}
	}
	if err == nil && res.Outcome == Processed {
		err = it.Fn(ctx, tx)
	}
	if err == nil {
		return nil
	}
	res.Outcome, res.Err = 0, err
	if _, rerr := ex.Exec(ctx, "ROLLBACK TO SAVEPOINT idem_inbox_item"); rerr != nil {
		return fmt.Errorf("idem/inbox: rollback to savepoint: %w", rerr)
	}
	// The claim was made before the savepoint: remove it, so the
	// redelivery runs the item.
	if _, derr := ex.Exec(ctx, i.sql.unclaim, it.Event.Consumer, it.Event.CorrelationID); derr != nil {
		return fmt.Errorf("idem/inbox: unclaim %s/%s: %w", it.Event.Consumer, it.Event.CorrelationID, derr)
	}
	return nil
}

// claimAll inserts every valid item's key in one statement and returns the
// keys it inserted (a key already there, or twice in the batch, is inserted
// once at most).
//
// The keys are inserted in key order, so two batches that share keys wait
// for each other in one order and never deadlock.
func (i *Inbox[TTx]) claimAll(ctx context.Context, ex sqldriver.Executor, items []BatchItem[TTx], valid []int) (map[string]bool, error) {
	args := make([]any, 1, 1+3*len(valid))
	args[0] = i.cfg.ConsumerVersion
	ordered := slices.Clone(valid)
	slices.SortFunc(ordered, func(a, b int) int {
		ea, eb := items[a].Event, items[b].Event
		return cmp.Or(strings.Compare(ea.Consumer, eb.Consumer), strings.Compare(ea.CorrelationID, eb.CorrelationID))
	})
	for _, n := range ordered {
		ev := items[n].Event
		args = append(args, ev.Consumer, ev.CorrelationID, ev.Type)
	}
	if i.mysql {
		return i.claimEach(ctx, ex, items, ordered)
	}
	rows, err := ex.Query(ctx, i.claimAllSQL(len(valid)), args...)
	if err != nil {
		return nil, fmt.Errorf("idem/inbox: claim a batch of %d: %w", len(valid), err)
	}
	defer rows.Close()
	claimed := make(map[string]bool, len(valid))
	for rows.Next() {
		var consumer, id string
		if err := rows.Scan(&consumer, &id); err != nil {
			return nil, fmt.Errorf("idem/inbox: claim a batch: %w", err)
		}
		claimed[batchKey(consumer, id)] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idem/inbox: claim a batch of %d: %w", len(valid), err)
	}
	return claimed, nil
}

// claimEach claims the keys of items (in the order given, the same in
// every batch) one statement each: a key claimed is one whose row the
// statement inserted.
func (i *Inbox[TTx]) claimEach(ctx context.Context, ex sqldriver.Executor, items []BatchItem[TTx], ordered []int) (map[string]bool, error) {
	claimed := make(map[string]bool, len(ordered))
	for _, n := range ordered {
		ev := items[n].Event
		k := batchKey(ev.Consumer, ev.CorrelationID)
		if _, seen := claimed[k]; seen {
			continue
		}
		added, err := ex.Exec(ctx, i.sql.claim, ev.Consumer, ev.CorrelationID, ev.Type, i.cfg.ConsumerVersion)
		if err != nil {
			return nil, fmt.Errorf("idem/inbox: claim %s/%s: %w", ev.Consumer, ev.CorrelationID, err)
		}
		claimed[k] = added == 1
	}
	return claimed, nil
}

func batchKey(consumer, id string) string { return consumer + "\x00" + id }

// claimAllSQL is the multi-row claim of n keys: $1 is the consumer version,
// then consumer, correlation id and type per row.
func (i *Inbox[TTx]) claimAllSQL(n int) string {
	var b strings.Builder
	b.WriteString(i.sql.claimMany)
	for r := range n {
		if r > 0 {
			b.WriteString(", ")
		}
		p := 2 + 3*r
		b.WriteString("($" + strconv.Itoa(p) + ", $" + strconv.Itoa(p+1) + ", $" + strconv.Itoa(p+2) + ", " + i.driver.Dialect().Now() + ", $1)")
	}
	b.WriteString(i.sql.claimManyEnd)
	return b.String()
}
