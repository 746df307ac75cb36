-- requeue: put dead-lettered tasks back, due now, with a fresh attempt count.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] limit: with no ids, requeue up to this many of the oldest dead tasks
-- ARGV[2..] ids (none = the oldest `limit`)
-- Reply: number of tasks requeued
local limit = tonumber(ARGV[1])
local ids = {}
if #ARGV > 1 then
  for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGE', K_DEAD, 0, limit - 1)
end
local now = now_ms()
local old_head = head_score(K_DELAYED)
local new_min = nil
local moved = 0
for _, id in ipairs(ids) do
  local s = redis.call('ZSCORE', K_DEAD, id)
  if s then
    redis.call('ZREM', K_DEAD, id)
    redis.call('HDEL', K_ATTEMPTS, id)
    local ns = score(now, slot_of(s))
    redis.call('ZADD', K_DELAYED, fmt(ns), id)
    if not new_min or ns < new_min then new_min = ns end
    moved = moved + 1
  end
end
count('requeued', moved)
announce_if_earlier(new_min, old_head)
return moved
