// Command benchscripts writes the server-side twins of idem's store
// transitions, so scripts/bench-stores.sh (and scripts/pg-buckets.sh) can
// run exactly the same round trips with pgbench and redis-benchmark:
//
//	benchscripts pgbench SCHEMA > lifecycle.sql   # pgbench -f: acquire then complete
//	benchscripts pgbench-batch SCHEMA > batch.sql # the same for 16 keys, as coalescing sends them
//	benchscripts redis-acquire > acquire.lua      # the Lua scripts of redisstore
//	benchscripts redis-owned > owned.lua
//	benchscripts redis-library > library.lua      # the same as Redis functions (FUNCTION LOAD), as idem calls them
//	benchscripts redis-function acquire|settle    # the name of each in that library (FCALL)
package main
