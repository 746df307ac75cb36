-- stats: counts per state and lifetime counters; O(log N), no scans.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] overdue_after_ms: a due task waiting longer than this counts as overdue
-- Reply: {now, delayed, ready, inflight, dead, overdue, oldest due ms or -1,
--         next due ms or -1, counter name, value, ...}; a paused queue adds the pair
--         'pause:until', epoch ms (0: until resumed)
local overdue_after = tonumber(ARGV[1])
local now = now_ms()
local total = redis.call('ZCARD', K_DELAYED)
local ready = redis.call('ZCOUNT', K_DELAYED, '-inf', fmt(score(now, 9)))
local overdue = redis.call('ZCOUNT', K_DELAYED, '-inf', fmt(score(now - overdue_after, 9)))
local head = head_score(K_DELAYED)
local oldest, next_due = -1, -1
if head then
  if ms_of(head) <= now then oldest = ms_of(head) end
  local ahead = redis.call('ZRANGEBYSCORE', K_DELAYED, '(' .. fmt(score(now, 9)), '+inf',
    'WITHSCORES', 'LIMIT', 0, 1)
  if ahead[2] then next_due = ms_of(ahead[2]) end
end
local reply = {now, total - ready, ready, redis.call('ZCARD', K_INFLIGHT),
  redis.call('ZCARD', K_DEAD), overdue, oldest, next_due}
local counters = redis.call('HGETALL', K_COUNTERS)
for i = 1, #counters do reply[#reply + 1] = counters[i] end
-- [L] flow control, under reserved names after the counters: pause:until (0 = until resumed)
local paused, paused_until = queue_pause_state(now)
if paused then
  reply[#reply + 1] = 'pause:until'
  reply[#reply + 1] = paused_until
end
return reply
