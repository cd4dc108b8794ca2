package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/idemgo/idem/store"
)

// DefaultMaxResultBytes is the largest result the store keeps by default:
// DynamoDB's item limit (400 KB) less room for the key and the other
// attributes.
const DefaultMaxResultBytes = 350 << 10

// Config configures a Store.
type Config struct {
	// Client is the DynamoDB client. Required.
	Client *dynamodb.Client
	// Table is the table's name. Required.
	Table string
	// Limits bound what the store accepts. MaxResultBytes defaults to
	// DefaultMaxResultBytes, and may not exceed it.
	Limits store.Limits
	// Clock tells the time. Defaults to the wall clock.
	Clock interface{ Now() time.Time }
}

// Store is a DynamoDB store.Store.
type Store struct {
	c      *dynamodb.Client
	table  *string
	limits store.Limits
	now    func() time.Time
	fences store.FenceSequence
}

var (
	_ store.Store         = (*Store)(nil)
	_ store.Unclaimer     = (*Store)(nil)
	_ store.FencedDeleter = (*Store)(nil)
	_ store.Migrator      = (*Store)(nil)
)

// New returns a store on cfg.Table; Migrate creates it.
func New(cfg Config) (*Store, error) {
	if cfg.Client == nil || cfg.Table == "" {
		return nil, errors.New("idem/dynamostore: Config.Client and Config.Table are required")
	}
	if cfg.Limits.MaxResultBytes == 0 {
		cfg.Limits.MaxResultBytes = DefaultMaxResultBytes
	}
	if cfg.Limits.MaxResultBytes > DefaultMaxResultBytes {
		return nil, fmt.Errorf("idem/dynamostore: Limits.MaxResultBytes %d: a DynamoDB item holds at most 400 KB, the limit is %d", cfg.Limits.MaxResultBytes, DefaultMaxResultBytes)
	}
	now := time.Now
	if cfg.Clock != nil {
		now = cfg.Clock.Now
	}
	return &Store{c: cfg.Client, table: aws.String(cfg.Table), limits: cfg.Limits.WithDefaults(), now: now}, nil
}

// once makes a call one attempt: the SDK's retries are off. A call whose
// answer is lost may have taken effect; resent, a claim would meet itself
// and a settle its own result. The Guard retries what it may, knowing
// that (as for Redis and PostgreSQL, whose clients' resends are off too).
func once(o *dynamodb.Options) { o.Retryer = aws.NopRetryer{} }

// Attribute names.
const (
	aKey      = "k"   // the storage key: the partition key
	aVersion  = "v"   // bumped by every write: what a read-then-write is conditioned on
	aState    = "st"  // store.State
	aFence    = "f"   // the fence
	aFP       = "fp"  // the fingerprint
	aAttempts = "at"  // attempts
	aResult   = "r"   // the result (binary; absent when empty)
	aLease    = "lu"  // lease end, Unix ms
	aExpires  = "ex"  // retention end, Unix ms: the logical expiry every read checks
	aUpdated  = "up"  // last transition, Unix ms
	aTTL      = "ttl" // DynamoDB's TTL attribute, Unix seconds (a little after ex)
)

// item is a record as the table holds it.
type item struct {
	version  uint64
	state    store.State
	fence    uint64
	fp       string
	attempts int
	result   []byte
	lease    int64 // ms
	expires  int64 // ms
	updated  int64 // ms
}

func num(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}
func unum(v uint64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatUint(v, 10)}
}
func str(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }

func (it *item) attributes(key string) map[string]types.AttributeValue {
	m := map[string]types.AttributeValue{
		aKey: str(key), aVersion: unum(it.version), aState: num(int64(it.state)), aFence: unum(it.fence),
		aAttempts: num(int64(it.attempts)), aLease: num(it.lease), aExpires: num(it.expires), aUpdated: num(it.updated),
		aTTL: num(it.expires/1000 + 1),
	}
	if it.fp != "" {
		m[aFP] = str(it.fp)
	}
	if len(it.result) > 0 {
		m[aResult] = &types.AttributeValueMemberB{Value: it.result}
	}
	return m
}

func parseItem(m map[string]types.AttributeValue) (item, error) {
	var it item
	n := func(name string) (int64, error) {
		v, ok := m[name].(*types.AttributeValueMemberN)
		if !ok {
			return 0, fmt.Errorf("idem/dynamostore: the item has no number %s", name)
		}
		return strconv.ParseInt(v.Value, 10, 64)
	}
	u := func(name string) (uint64, error) {
		v, ok := m[name].(*types.AttributeValueMemberN)
		if !ok {
			return 0, fmt.Errorf("idem/dynamostore: the item has no number %s", name)
		}
		return strconv.ParseUint(v.Value, 10, 64)
	}
	var err error
	var st, at int64
	if it.version, err = u(aVersion); err != nil {
		return it, err
	}
	if it.fence, err = u(aFence); err != nil {
		return it, err
	}
	if st, err = n(aState); err != nil {
		return it, err
	}
	if at, err = n(aAttempts); err != nil {
		return it, err
	}
	if it.lease, err = n(aLease); err != nil {
		return it, err
	}
	if it.expires, err = n(aExpires); err != nil {
		return it, err
	}
	if it.updated, err = n(aUpdated); err != nil {
		return it, err
	}
	it.state, it.attempts = store.State(st), int(at)
	if v, ok := m[aFP].(*types.AttributeValueMemberS); ok {
		it.fp = v.Value
	}
	if v, ok := m[aResult].(*types.AttributeValueMemberB); ok {
		it.result = v.Value
	}
	return it, nil
}

func (it *item) record(key string) store.Record {
	r := store.Record{Key: key, State: it.state, Fence: it.fence, Fingerprint: it.fp, Attempts: it.attempts,
		ExpiresAt: time.UnixMilli(it.expires), UpdatedAt: time.UnixMilli(it.updated)}
	if len(it.result) > 0 {
		r.Result = append([]byte(nil), it.result...)
	}
	if it.state == store.StateInFlight {
		r.LeaseUntil = time.UnixMilli(it.lease)
	}
	return r
}

// wrap makes err a store error: a failed condition is the caller's to
// read; throttling, timeouts and failures to reach DynamoDB are
// store.ErrUnavailable.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("idem/dynamostore: %s: %w: %w", op, store.ErrUnavailable, err)
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorFault() == smithy.FaultClient {
		switch apiErr.ErrorCode() {
		case "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded", "LimitExceededException":
		default:
			return fmt.Errorf("idem/dynamostore: %s: %w", op, err)
		}
	}
	return fmt.Errorf("idem/dynamostore: %s: %w: %w", op, store.ErrUnavailable, err)
}

func conditionFailed(err error) (*types.ConditionalCheckFailedException, bool) {
	var cf *types.ConditionalCheckFailedException
	return cf, errors.As(err, &cf)
}

// get reads key's item, consistently; ok=false when there is none.
func (s *Store) get(ctx context.Context, key string) (item, bool, error) {
	out, err := s.c.GetItem(ctx, &dynamodb.GetItemInput{TableName: s.table, Key: map[string]types.AttributeValue{aKey: str(key)}, ConsistentRead: aws.Bool(true)}, once)
	if err != nil {
		return item{}, false, wrap("get", err)
	}
	if len(out.Item) == 0 {
		return item{}, false, nil
	}
	it, err := parseItem(out.Item)
	return it, err == nil, err
}

// put writes it under key if the item is still at version prev (or absent,
// for prev 0); ok=false when another writer came first, with the item it
// left where DynamoDB says (nil otherwise).
func (s *Store) put(ctx context.Context, key string, it *item, prev uint64) (ok bool, current map[string]types.AttributeValue, err error) {
	in := &dynamodb.PutItemInput{TableName: s.table, Item: it.attributes(key),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld}
	cond := "attribute_not_exists(#k)"
	if prev != 0 {
		cond = "#v = :v"
		in.ExpressionAttributeValues = map[string]types.AttributeValue{":v": unum(prev)}
	}
	in.ConditionExpression, in.ExpressionAttributeNames = aws.String(cond), names(cond)
	_, err = s.c.PutItem(ctx, in, once)
	if cf, failed := conditionFailed(err); failed {
		return false, cf.Item, nil
	}
	if err != nil {
		return false, nil, wrap("put", err)
	}
	return true, nil, nil
}

func ms(t time.Time) int64 { return t.UnixMilli() }

// names maps each #name placeholder the expressions use to the attribute
// name after the #: every attribute is named through a placeholder, so
// that none collides with DynamoDB's reserved words (TTL, AT, …).
func names(exprs ...string) map[string]string {
	m := map[string]string{}
	for _, e := range exprs {
		for i := 0; i < len(e); i++ {
			if e[i] != '#' {
				continue
			}
			j := i + 1
			for j < len(e) && (e[j] >= 'a' && e[j] <= 'z') {
				j++
			}
			m[e[i:j]] = e[i+1 : j]
		}
	}
	return m
}

// Acquire implements store.Store: a conditional PutItem for a key that is
// not there; otherwise the item is read and written back on its version.
func (s *Store) Acquire(ctx context.Context, req store.AcquireRequest) (store.Acquisition, error) {
	if err := ctx.Err(); err != nil {
		return store.Acquisition{}, err
	}
	if err := s.limits.CheckAcquire(req); err != nil {
		return store.Acquisition{}, err
	}
	var cur map[string]types.AttributeValue // the item, if known
	known := false                          // whether cur says what the table holds (nil: nothing)
	for {
		now := s.now()
		nowMS := ms(now)
		leaseUntil := ms(now.Add(req.Lease))
		expires := ms(now.Add(max(req.Retention, req.Lease)))
		var old item
		exists := false
		if known && cur != nil {
			var err error
			if old, err = parseItem(cur); err != nil {
				return store.Acquisition{}, err
			}
			exists = true
		} else if !known {
			// First try: assume the key is new (the common case), one write.
			it := item{version: 1, state: store.StateInFlight, fence: s.fences.Next(now, 0), fp: req.Fingerprint, attempts: 1,
				lease: leaseUntil, expires: expires, updated: nowMS}
			ok, current, err := s.put(ctx, req.Key, &it, 0)
			if err != nil {
				return store.Acquisition{}, err
			}
			if ok {
				return store.Acquisition{Outcome: store.Acquired, Fence: it.fence, Record: it.record(req.Key)}, nil
			}
			if current == nil { // the endpoint does not return the item: read it
				if old, exists, err = s.get(ctx, req.Key); err != nil {
					return store.Acquisition{}, err
				}
			} else {
				if old, err = parseItem(current); err != nil {
					return store.Acquisition{}, err
				}
				exists = true
			}
		}
		if !exists {
			known, cur = false, nil // gone since: try the new-key write again
			continue
		}
		next, res, write := s.decide(old, req, now, leaseUntil, expires)
		if !write {
			return res, nil
		}
		ok, current, err := s.put(ctx, req.Key, &next, old.version)
		if err != nil {
			return store.Acquisition{}, err
		}
		if ok {
			res.Fence = next.fence
			if res.Outcome == store.Poisoned {
				res.Fence = 0
			}
			res.Record = next.record(req.Key)
			return res, nil
		}
		// Another writer came first: decide again on what it left.
		if current != nil {
			known, cur = true, current
		} else if it, there, err := s.get(ctx, req.Key); err != nil {
			return store.Acquisition{}, err
		} else if there {
			known, cur = true, it.attributes(req.Key)
		} else {
			known, cur = false, nil
		}
	}
}

// decide is what an acquisition does to old at now: the outcome, and the
// item to write (write=false: nothing changes).
func (s *Store) decide(old item, req store.AcquireRequest, now time.Time, leaseUntil, expires int64) (next item, res store.Acquisition, write bool) {
	nowMS := ms(now)
	if old.expires <= nowMS { // past retention: a new generation
		next = item{version: old.version + 1, state: store.StateInFlight, fence: s.fences.Next(now, old.fence), fp: req.Fingerprint,
			attempts: 1, lease: leaseUntil, expires: expires, updated: nowMS}
		return next, store.Acquisition{Outcome: store.Acquired}, true
	}
	if old.fp != req.Fingerprint {
		return item{}, store.Acquisition{Outcome: store.Mismatch, Record: old.record(req.Key)}, false
	}
	switch old.state {
	case store.StateCompleted, store.StateFailed:
		return item{}, store.Acquisition{Outcome: store.Replayed, Record: old.record(req.Key)}, false
	case store.StatePoisoned:
		return item{}, store.Acquisition{Outcome: store.Poisoned, Record: old.record(req.Key)}, false
	case store.StateInFlight:
		if nowMS < old.lease {
			return item{}, store.Acquisition{Outcome: store.InProgress, Record: old.record(req.Key)}, false
		}
	}
	next = old
	next.version++
	next.updated = nowMS
	next.expires = max(old.expires, expires) // never shortened
	if req.MaxAttempts > 0 && old.attempts >= req.MaxAttempts {
		next.state = store.StatePoisoned
		next.fence = s.fences.Next(now, old.fence)
		return next, store.Acquisition{Outcome: store.Poisoned}, true
	}
	outcome := store.Acquired
	if old.state == store.StateInFlight {
		outcome = store.TakenOver
	}
	next.state, next.fence, next.attempts, next.lease = store.StateInFlight, s.fences.Next(now, old.fence), old.attempts+1, leaseUntil
	return next, store.Acquisition{Outcome: outcome}, true
}

// ownedCond is the condition of a write by the owner of fence: the record
// in flight under it, not past its retention.
const ownedCond = "#st = :fl AND #f = :fence AND #ex > :now"

// owned runs update (an UpdateExpression and its values) on key's item if
// it is in flight under fence and not past its retention (and cond, if
// set); ok=false otherwise.
func (s *Store) owned(ctx context.Context, op, key string, fence uint64, now int64, cond, update string, values map[string]types.AttributeValue) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	values[":fl"] = num(int64(store.StateInFlight))
	values[":fence"] = unum(fence)
	values[":now"] = num(now)
	values[":one"] = num(1)
	condition := ownedCond
	if cond != "" {
		condition += " AND " + cond
	}
	update = strings.Replace(update, "SET ", "SET #v = #v + :one, ", 1)
	_, err := s.c.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: s.table, Key: map[string]types.AttributeValue{aKey: str(key)},
		ConditionExpression: aws.String(condition), UpdateExpression: aws.String(update),
		ExpressionAttributeNames: names(condition, update), ExpressionAttributeValues: values}, once)
	if _, failed := conditionFailed(err); failed {
		return false, nil
	}
	return err == nil, wrap(op, err)
}

// ownedOrStale is owned whose failed condition is store.ErrStaleFence.
func (s *Store) ownedOrStale(ctx context.Context, op, key string, fence uint64, update string, values map[string]types.AttributeValue) error {
	ok, err := s.owned(ctx, op, key, fence, ms(s.now()), "", update, values)
	if err == nil && !ok {
		err = fmt.Errorf("idem/dynamostore: %s %s: %w", op, store.DisplayKey(key), store.ErrStaleFence)
	}
	return err
}

// Heartbeat implements store.Store: the lease is extended, and the
// retention with it where it would end first — one conditional update
// (two where the retention must move: UpdateExpression has no max).
func (s *Store) Heartbeat(ctx context.Context, key string, fence uint64, lease time.Duration) error {
	if err := s.limits.CheckHeartbeat(key, lease); err != nil {
		return err
	}
	now := s.now()
	lu := ms(now.Add(lease))
	for range 3 {
		ok, err := s.owned(ctx, "heartbeat", key, fence, ms(now), "#ex >= :lu", "SET #lu = :lu, #up = :now",
			map[string]types.AttributeValue{":lu": num(lu)})
		if err != nil || ok {
			return err
		}
		ok, err = s.owned(ctx, "heartbeat", key, fence, ms(now), "#ex < :lu", "SET #lu = :lu, #ex = :lu, #ttl = :ttl, #up = :now",
			map[string]types.AttributeValue{":lu": num(lu), ":ttl": num(lu/1000 + 1)})
		if err != nil || ok {
			return err
		}
		// Neither: not the owner's any more — or the retention moved
		// between the two; ask again.
	}
	return fmt.Errorf("idem/dynamostore: heartbeat %s: %w", store.DisplayKey(key), store.ErrStaleFence)
}

func (s *Store) settle(ctx context.Context, op, key string, fence uint64, st store.State, result []byte, retention time.Duration) error {
	if err := s.limits.CheckSettle(key, result, retention); err != nil {
		return err
	}
	now := s.now()
	ex := ms(now.Add(retention))
	values := map[string]types.AttributeValue{":st": num(int64(st)), ":ex": num(ex), ":ttl": num(ex/1000 + 1)}
	update := "SET #st = :st, #ex = :ex, #ttl = :ttl, #up = :now"
	if len(result) > 0 {
		values[":r"] = &types.AttributeValueMemberB{Value: result}
		update += ", #r = :r"
	}
	if len(result) == 0 {
		update += " REMOVE #r"
	}
	ok, err := s.owned(ctx, op, key, fence, ms(now), "", update, values)
	if err == nil && !ok {
		err = fmt.Errorf("idem/dynamostore: %s %s: %w", op, store.DisplayKey(key), store.ErrStaleFence)
	}
	return err
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settle(ctx, "complete", key, fence, store.StateCompleted, result, retention)
}

// Fail implements store.Store.
func (s *Store) Fail(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settle(ctx, "fail", key, fence, store.StateFailed, result, retention)
}

// Release implements store.Store: the record is released, its retention
// kept.
func (s *Store) Release(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.ownedOrStale(ctx, "release", key, fence, "SET #st = :rel, #up = :now",
		map[string]types.AttributeValue{":rel": num(int64(store.StateReleased))})
}

// Unclaim implements store.Unclaimer: Release that also takes back the
// claim's attempt.
func (s *Store) Unclaim(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.ownedOrStale(ctx, "unclaim", key, fence, "SET #st = :rel, #up = :now, #at = #at - :one",
		map[string]types.AttributeValue{":rel": num(int64(store.StateReleased))})
}

// PoisonClaim implements store.Unclaimer: one conditional update makes the
// claim poisoned and takes back its attempt.
func (s *Store) PoisonClaim(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.ownedOrStale(ctx, "poison claim", key, fence, "SET #st = :poi, #up = :now, #at = #at - :one",
		map[string]types.AttributeValue{":poi": num(int64(store.StatePoisoned))})
}

// Get implements store.Store: a strongly consistent read; a record past its
// retention is absent, whether or not TTL deleted it yet.
func (s *Store) Get(ctx context.Context, key string) (store.Record, error) {
	if err := ctx.Err(); err != nil {
		return store.Record{}, err
	}
	if err := store.ValidateKey(key); err != nil {
		return store.Record{}, err
	}
	it, ok, err := s.get(ctx, key)
	if err != nil {
		return store.Record{}, err
	}
	if !ok || it.expires <= ms(s.now()) {
		return store.Record{}, store.ErrNotFound
	}
	return it.record(key), nil
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	_, err := s.c.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: s.table, Key: map[string]types.AttributeValue{aKey: str(key)}}, once)
	return wrap("delete", err)
}

// DeleteUpTo implements store.FencedDeleter.
func (s *Store) DeleteUpTo(ctx context.Context, key string, fence uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	_, err := s.c.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: s.table, Key: map[string]types.AttributeValue{aKey: str(key)},
		ConditionExpression: aws.String("#f <= :fence"), ExpressionAttributeNames: names("#f"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":fence": unum(fence)}}, once)
	if _, failed := conditionFailed(err); failed {
		return nil // absent, or a later fence: kept
	}
	return wrap("delete", err)
}

// sweepable is the condition of a record Sweep deletes: past its retention,
// not under a live lease.
const sweepable = "#ex <= :now AND (#st <> :fl OR #lu <= :now)"

// Sweep implements store.Store: it scans for records past their retention
// (not under a live lease) and deletes up to limit of them, each on the
// condition that it still is.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	deleted := 0
	var start map[string]types.AttributeValue
	for deleted < limit {
		now := num(ms(s.now()))
		out, err := s.c.Scan(ctx, &dynamodb.ScanInput{TableName: s.table, ExclusiveStartKey: start, ConsistentRead: aws.Bool(true),
			FilterExpression: aws.String(sweepable), ProjectionExpression: aws.String("#k"), ExpressionAttributeNames: names(sweepable, "#k"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":now": now, ":fl": num(int64(store.StateInFlight))}}, once)
		if err != nil {
			return deleted, wrap("sweep", err)
		}
		for _, it := range out.Items {
			if deleted >= limit {
				break
			}
			_, err := s.c.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: s.table, Key: map[string]types.AttributeValue{aKey: it[aKey]},
				ConditionExpression: aws.String(sweepable), ExpressionAttributeNames: names(sweepable),
				ExpressionAttributeValues: map[string]types.AttributeValue{":now": now, ":fl": num(int64(store.StateInFlight))}}, once)
			if _, failed := conditionFailed(err); failed {
				continue // claimed again meanwhile
			}
			if err != nil {
				return deleted, wrap("sweep", err)
			}
			deleted++
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		start = out.LastEvaluatedKey
	}
	return deleted, nil
}

// Close implements store.Store; the client is the caller's.
func (s *Store) Close() error { return nil }

// Migrate implements store.Migrator: it creates the table (on-demand
// capacity, the partition key k, a string) if missing, waits until it is
// active, and turns TTL on for the ttl attribute; an existing table with
// another key schema is an error that says what is wrong.
func (s *Store) Migrate(ctx context.Context) error {
	desc, err := s.c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: s.table}, once)
	var missing *types.ResourceNotFoundException
	switch {
	case errors.As(err, &missing):
		_, err = s.c.CreateTable(ctx, &dynamodb.CreateTableInput{TableName: s.table, BillingMode: types.BillingModePayPerRequest,
			AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(aKey), AttributeType: types.ScalarAttributeTypeS}},
			KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(aKey), KeyType: types.KeyTypeHash}}}, once)
		var inUse *types.ResourceInUseException
		if err != nil && !errors.As(err, &inUse) {
			return wrap("create table", err)
		}
		waiter := dynamodb.NewTableExistsWaiter(s.c, func(o *dynamodb.TableExistsWaiterOptions) {
			o.MinDelay = 100 * time.Millisecond
			o.MaxDelay = time.Second
		})
		if err := waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: s.table}, 2*time.Minute); err != nil {
			return wrap("wait for the table", err)
		}
	case err != nil:
		return wrap("describe table", err)
	default:
		t := desc.Table
		if len(t.KeySchema) != 1 || aws.ToString(t.KeySchema[0].AttributeName) != aKey || t.KeySchema[0].KeyType != types.KeyTypeHash {
			return fmt.Errorf("idem/dynamostore: the table %s exists with another key schema %v: idem's has one partition key, k, a string", *s.table, keyNames(t.KeySchema))
		}
		for _, a := range t.AttributeDefinitions {
			if aws.ToString(a.AttributeName) == aKey && a.AttributeType != types.ScalarAttributeTypeS {
				return fmt.Errorf("idem/dynamostore: the table %s's key k is of type %s, idem's is a string (S)", *s.table, a.AttributeType)
			}
		}
	}
	ttl, err := s.c.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: s.table}, once)
	if unknownOperation(err) {
		return nil // an endpoint without TTL (dynalite): Sweep deletes what expired
	}
	if err == nil && ttl.TimeToLiveDescription != nil && aws.ToString(ttl.TimeToLiveDescription.AttributeName) == aTTL &&
		(ttl.TimeToLiveDescription.TimeToLiveStatus == types.TimeToLiveStatusEnabled || ttl.TimeToLiveDescription.TimeToLiveStatus == types.TimeToLiveStatusEnabling) {
		return nil
	}
	_, err = s.c.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{TableName: s.table,
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(aTTL), Enabled: aws.Bool(true)}}, once)
	if unknownOperation(err) {
		return nil
	}
	return wrap("enable TTL", err)
}

// unknownOperation reports an endpoint that does not have the operation.
func unknownOperation(err error) bool {
	var apiErr smithy.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode() == "UnknownOperationException"
}

func keyNames(ks []types.KeySchemaElement) []string {
	var out []string
	for _, k := range ks {
		out = append(out, aws.ToString(k.AttributeName)+" ("+string(k.KeyType)+")")
	}
	return out
}
