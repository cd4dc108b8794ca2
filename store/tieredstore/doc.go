// Package tieredstore puts a hot store (Redis, memory) in front of a cold one
// (PostgreSQL, SQLite): claims, leases and fresh results live in the hot
// store; every settled record is also archived in the cold store for the long
// audit window, so a duplicate that arrives after the hot store forgot the key
// is still caught.
//
// Round trips: a claim of a key new to the hot store costs one hot acquire
// and one cold read; a replay or an in-progress answer, one hot acquire;
// Complete and Fail, one hot settle, one hot read and one cold write. Each
// step is atomic in its tier; the fence is checked by the hot tier before
// anything reaches the cold one.
package tieredstore
