-- schedule_upsert: create or change a recurring schedule, atomically, keyed on its spec's
-- hash: the same spec again (50 pods at boot) changes nothing.
-- KEYS:  the queue key set (see _lib.lua); the schedule's keys derive from it (sched:*).
-- ARGV[1] name   ARGV[2] spec hash   ARGV[3] spec as JSON (read back by Python)
-- ARGV[4] kind 'cron' | 'every'   ARGV[5] every ms   ARGV[6] phase ms
-- ARGV[7] start ms (0 = none)   ARGV[8] end ms (0 = none)   ARGV[9] max fires (0 = none)
-- ARGV[10] jitter ms   ARGV[11] overlap   ARGV[12] catchup   ARGV[13] catchup window ms (0)
-- ARGV[14] priority   ARGV[15] envelope template   ARGV[16] its fire-time placeholder
-- Reply: {status, version, cursor ms, cron times ahead}; status 0 = the same spec was there
--        (nothing changed), 1 = created (or re-created after a remove), 2 = changed: the
--        version went up, the fire not yet due was dropped (its time given back if it was
--        the cursor's: it fires under the new spec) and the chain goes on from
--        max(now, cursor). A cron schedule then needs its times (schedule_refill.lua).
--        status -2 = refused: a reshard moved the schedule away from this (sub-)queue, or
--        is moving them all away (a new one belongs in the new layout).
local name, hash = ARGV[1], ARGV[2]
local now = now_ms()
local st_key = sched_key('sched:st:' .. name)
local at_key = sched_key('sched:at:' .. name)
local old = redis.call('HMGET', st_key, 'ver', 'hash', 'gone', 'cursor', 'mv')
if old[1] and old[3] ~= '1' and old[2] == hash then
  return {0, tonumber(old[1]), tonumber(old[4]), redis.call('ZCARD', at_key)}
end
local status = (old[1] and old[3] ~= '1') and 2 or 1
-- A reshard moved the schedule away, or is moving this (sub-)queue's schedules away: the
-- writer's layout is out of date (schedule_move.lua); it reads the layout again.
if old[5] or (status == 1 and redis.call('EXISTS', sched_key('sched:away')) == 1) then
  return {-2, 0, 0, 0}
end
local ver = tonumber(old[1] or '0') + 1
if status == 2 then sched_drop_pending(name, now) end  -- may give its time back (cursor)
local cursor = math.max(tonumber(redis.call('HGET', st_key, 'cursor') or '0'), now)
redis.call('DEL', at_key)
redis.call('HSET', st_key, 'ver', ver, 'hash', hash, 'spec', ARGV[3], 'kind', ARGV[4],
  'every', ARGV[5], 'phase', ARGV[6], 'start', ARGV[7], 'end', ARGV[8], 'maxf', ARGV[9],
  'jit', ARGV[10], 'ovl', ARGV[11], 'cu', ARGV[12], 'win', ARGV[13], 'prio', ARGV[14],
  'tpl', ARGV[15], 'ph', ARGV[16], 'cursor', fmt(cursor), 'gone', 0, 'done', 0, 'exh', 0,
  'changed_ms', fmt(now))
for _, field in ipairs({'fired', 'skipped', 'missed', 'manual', 'backfilled', 'live'}) do
  redis.call('HSETNX', st_key, field, 0)
end
-- A pause is the live schedule's: one re-created after a remove starts unpaused.
if status == 1 then redis.call('HSET', st_key, 'paused', 0, 'note', '') end
redis.call('HSETNX', st_key, 'created_ms', fmt(now))
redis.call('PERSIST', st_key)  -- a tombstone no more
redis.call('ZREM', sched_key('sched:gone'), name)
redis.call('HSET', sched_key('sched'), name, ver)
local st = sched_state(name)
if st.paused ~= '1' then sched_plan(name, st, now) end
return {status, ver, cursor, 0}
