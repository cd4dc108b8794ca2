// Package mono reads the monotonic clock alone. A time.Now reads the wall
// clock and the monotonic clock both; where only elapsed time matters — a
// lease's end by this process's count, a tick's due time — one reading of
// the monotonic clock does, at about half the cost, and its value is one
// integer instead of a time.Time.
package mono

import "time"

// epoch is the origin of every Time: this package's initialization.
var epoch = time.Now()

// Time is a reading of the monotonic clock: the time since the process
// started (the package's initialization). Times compare and subtract as
// integers; they mean nothing to another process.
type Time time.Duration

// Now reads the monotonic clock.
func Now() Time { return Time(time.Since(epoch)) }

// Sub returns t-u.
func (t Time) Sub(u Time) time.Duration { return time.Duration(t - u) }

// Add returns t+d.
func (t Time) Add(d time.Duration) Time { return t + Time(d) }

// Until returns how long until t.
func Until(t Time) time.Duration { return t.Sub(Now()) }

// Wall returns t as a time.Time (carrying the monotonic reading, so
// time.Until, Before and Sub of it count on the monotonic clock), for an
// API that takes one. Its wall-clock reading is the epoch's plus t: it
// differs from time.Now's by whatever step the wall clock took since the
// process started.
func (t Time) Wall() time.Time { return epoch.Add(time.Duration(t)) }
