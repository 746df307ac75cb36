-- reschedule: move a waiting task's due time, keeping its priority (and its ttl span).
-- KEYS:  the queue key set (see _lib.lua), then KEYS[14]: this call's receipt, and for an
--        outbox row (optional) KEYS[15]: the shard's applied set (see _lib.lua)
-- ARGV[1] ms to keep the receipt (this reply, for a resend of the same call)
-- ARGV[2] id   ARGV[3] due kind ('d' = relative ms, 'a' = absolute epoch ms)   ARGV[4] value
-- ARGV[5], ARGV[6] with KEYS[15]: the row's apply id and the ms to keep its receipt
-- Reply: {1, new due ms} when moved; {0, now} when the task is not waiting; {2, now} when the
--        outbox row was applied before (nothing done). A resend of the same call (a lost
--        reply) gets the first reply: a relative move is not made twice from a later now,
--        nor its history event written twice.
local receipt = KEYS[14]
local earlier = redis.call('GET', receipt)  -- 'status|ms'
if earlier then
  local bar = string.find(earlier, '|', 1, true)
  return {tonumber(string.sub(earlier, 1, bar - 1)), tonumber(string.sub(earlier, bar + 1))}
end
local id, kind, value, keep_ms = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[1])
local function kept(reply)  -- the reply, kept for a resend
  redis.call('SET', receipt, reply[1] .. '|' .. fmt(reply[2]), 'PX', keep_ms)
  return reply
end
local now, later = now_ms()
local applied = KEYS[15]
if applied then
  if not unapplied(applied, {ARGV[5]}, now)[1] then
    return kept({2, now})
  end
  record_applied(applied, {ARGV[5]}, now, tonumber(ARGV[6]))
end
local old = redis.call('ZSCORE', K_DELAYED, id)
if not old then  -- [L] waiting in its limit key's line: back to the delayed set, moved
  local key, parked_score = parked(id)
  if not key then return kept({0, now}) end
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
return kept({1, due})
