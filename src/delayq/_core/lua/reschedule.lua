-- reschedule: move a waiting task's due time, keeping its priority (and its ttl span).
-- KEYS:  the queue key set (see _lib.lua); for an outbox row (optional) KEYS[14]: the
--        shard's applied set (see _lib.lua)
-- ARGV[1] id   ARGV[2] due kind ('d' = relative ms, 'a' = absolute epoch ms)   ARGV[3] value
-- ARGV[4], ARGV[5] with KEYS[14]: the row's apply id and the ms to keep its receipt
-- Reply: {1, new due ms} when moved; {0, now} when the task is not waiting; {2, now} when the
--        outbox row was applied before (nothing done).
local id, kind, value = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now, later = now_ms()
local applied = KEYS[14]
if applied then
  if not unapplied(applied, {ARGV[4]}, now)[1] then return {2, now} end
  record_applied(applied, {ARGV[4]}, now, tonumber(ARGV[5]))
end
local old = redis.call('ZSCORE', K_DELAYED, id)
if not old then  -- [L] waiting in its limit key's line: back to the delayed set, moved
  local key, parked_score = parked(id)
  if not key then return {0, now} end
  redis.call('ZREM', parked_key(key), id)
  old = parked_score
end
local due = value
if kind == 'd' then due = (value > 0 and later or now) + value end
local old_head = head_score(K_DELAYED)
local s = score(due, slot_of(old))
redis.call('ZADD', K_DELAYED, fmt(s), id)
local deadline = redis.call('ZSCORE', K_EXPIRY, id)
if deadline then
  redis.call('ZADD', K_EXPIRY, fmt(tonumber(deadline) + due - ms_of(old)), id)
end
hist_note(id, now, 'rescheduled', hist_due(due, now))  -- [H]
announce_if_earlier(s, old_head)
return {1, due}
