// Package tieredstore puts a hot store (Redis, memory) in front of a cold one
// (PostgreSQL, SQLite): claims, leases and fresh results live in the hot
// store; every settled record is also archived in the cold store for the long
// audit window, so a duplicate that arrives after the hot store forgot the key
// is still caught.
//
// A settle that outlives its own lease extension (the owner stalled longer
// than SettleTimeout between its archive and its hot settle, and another
// owner took the key over) is answered ErrSettleUncertain, not
// ErrStaleFence: its result may have been replayed before it was withdrawn.
// A request that meets a Delete under way is told to retry. An acquisition
// that fails closed gives its hot claim back without counting the attempt
// when the hot store implements store.Unclaimer (every store of this module
// does), so an outage of the cold tier never poisons a key. MaxAttempts is
// applied once the cold tier has been read: the hot tier claims without it
// (a key settled in the cold tier is replayed, never poisoned), and a claim
// past it is poisoned in one step (store.Unclaimer's PoisonClaim).
//
// Round trips: a fresh claim costs one hot acquire, one cold read and one
// fenced hot heartbeat (the claim must still stand after the cold read); a
// replay from the hot store, one hot acquire; an in-progress or mismatch
// answer, one hot acquire and one cold read (the hot record may be another
// caller's momentary claim on a key the cold store holds settled). Complete
// and Fail: one hot read (the fence check), one cold write (fenced: a larger
// fence replaces an archived result) and one hot settle — the cold write
// first, so a result is durable when Complete returns and an owner killed
// between the writes loses nothing. Delete removes the cold record first;
// Deletes of one key run one at a time (a delete lock in the hot store: one
// hot acquire and one hot release more), and a Delete reads the hot tier
// again after its tombstone.
//
// Not atomic across the tiers, in one narrow case: a duplicate that meets
// another caller's momentary hot claim (a re-warm, or another fingerprint
// consulting the cold tier) just as the cold record's retention ends may be
// told InProgress or Mismatch instead of getting the key as new. Nothing runs
// twice; its retry gets the key. And a caller whose cold read outlasts its
// request's lease leaves its momentary hot claim open to a takeover: the
// caller that takes it is told TakenOver although nothing ran under the
// claim (the hot tier cannot tell it from a dead owner's), and the first
// caller fails closed with ErrStoreUnavailable; one of them owns the key.
// The fault campaign declares both (storetest.CampaignConfig's
// InProgressAtExpiry and TakeoverOfMomentaryClaims) and checks everything
// else.
package tieredstore
