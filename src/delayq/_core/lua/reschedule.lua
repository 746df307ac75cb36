-- reschedule: move a waiting task's due time, keeping its priority (and its ttl span).
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] id   ARGV[2] due kind ('d' = relative ms, 'a' = absolute epoch ms)   ARGV[3] value
-- Reply: {1, new due ms} when moved; {0, now} when the task is not waiting.
local id, kind, value = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now, later = now_ms()
local old = redis.call('ZSCORE', K_DELAYED, id)
if not old then return {0, now} end
local due = value
if kind == 'd' then due = (value > 0 and later or now) + value end
local old_head = head_score(K_DELAYED)
local s = score(due, slot_of(old))
redis.call('ZADD', K_DELAYED, fmt(s), id)
local deadline = redis.call('ZSCORE', K_EXPIRY, id)
if deadline then
  redis.call('ZADD', K_EXPIRY, fmt(tonumber(deadline) + due - ms_of(old)), id)
end
announce_if_earlier(s, old_head)
return {1, due}
