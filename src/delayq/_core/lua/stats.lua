-- stats: counts per state and lifetime counters; O(log N), no scans.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] overdue_after_ms: a due task waiting longer than this counts as overdue
-- Reply: {now, delayed, ready, inflight, dead, overdue, oldest due ms or -1,
--         next due ms or -1, expired, counter name, value, ...}; inflight counts the live
--         leases, expired the leases that ran out with no consumer back to reclaim them
--         (the head of the inflight set: one ZCOUNT); a paused queue adds the pair
--         'pause:until', epoch ms (0: until resumed); a queue with limits 'lim:waiting' and
--         'lim:running' (totals) and 'limw:<key>' / 'limr:<key>' for its top keys; its
--         ready count includes the tasks waiting in limit keys' lines, and its overdue
--         count and oldest due time those of keys in line for their turn (not held back)
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
local expired = redis.call('ZCOUNT', K_INFLIGHT, '-inf', '(' .. fmt(score(now, 0)))
local reply = {now, total - ready, ready, redis.call('ZCARD', K_INFLIGHT) - expired,
  redis.call('ZCARD', K_DEAD), overdue, oldest, next_due, expired}
local counters = redis.call('HGETALL', K_COUNTERS)
for i = 1, #counters do reply[#reply + 1] = counters[i] end
-- [L] flow control, under reserved names after the counters: pause:until (0 = until resumed)
local paused, paused_until = queue_pause_state(now)
if paused then
  reply[#reply + 1] = 'pause:until'
  reply[#reply + 1] = paused_until
end
-- [L] limits: tasks waiting and leases running, in total and for the LIMIT_TOP keys with
-- the most (as 'limw:<key>' / 'limr:<key>'): exporters stay bounded however many keys exist
local LIMIT_TOP = 10
flow_probe()
if flow_seen.lim or flow_seen.held then
  local waiting, total = {}, 0
  local keys = redis.call('ZRANGE', flow_key('lim:gate'), 0, -1)
  for _, k in ipairs(redis.call('SMEMBERS', flow_key('lim:full'))) do keys[#keys + 1] = k end
  -- Keys in line (not held back by a limit): their tasks wait only for their turn, so they
  -- count as overdue and in the oldest due time as the delayed set's due tasks do.
  local in_line = redis.call('ZRANGE', flow_key('lim:ready'), 0, -1)
  local late = fmt(score(now - overdue_after, 9))
  for _, k in ipairs(in_line) do
    keys[#keys + 1] = k
    reply[6] = reply[6] + redis.call('ZCOUNT', parked_key(k), '-inf', late)
    local first = head_score(parked_key(k))
    if first and (reply[7] < 0 or ms_of(first) < reply[7]) then reply[7] = ms_of(first) end
  end
  local seen = {}
  for _, k in ipairs(keys) do
    if k ~= '*' and not seen[k] then
      seen[k] = true
      local n = redis.call('ZCARD', parked_key(k))
      total = total + n
      waiting[#waiting + 1] = {k, n}
    end
  end
  local running = {}
  local run = redis.call('HGETALL', flow_key('lim:run'))
  for i = 1, #run, 2 do
    if run[i] ~= '*' then running[#running + 1] = {run[i], tonumber(run[i + 1])} end
  end
  reply[3] = reply[3] + total  -- parked tasks are due and not handed out: ready
  reply[#reply + 1] = 'lim:waiting'
  reply[#reply + 1] = total
  reply[#reply + 1] = 'lim:running'
  reply[#reply + 1] = tonumber(redis.call('HGET', flow_key('lim:run'), '*') or '0')
  local throttled = {}  -- 'limt:<reason>:<key>': the keys held back most, per reason
  for _, reason in ipairs({'rate', 'concurrency', 'ratelimited'}) do
    local top = redis.call('ZREVRANGE', flow_key('lim:thr:' .. reason), 0, LIMIT_TOP - 1,
      'WITHSCORES')
    for i = 1, #top, 2 do
      reply[#reply + 1] = 'limt:' .. reason .. ':' .. top[i]
      reply[#reply + 1] = tonumber(top[i + 1])
    end
  end
  for prefix, rows in pairs({limw = waiting, limr = running}) do
    table.sort(rows, function(a, b) return a[2] > b[2] or (a[2] == b[2] and a[1] < b[1]) end)
    for i = 1, math.min(LIMIT_TOP, #rows) do
      reply[#reply + 1] = prefix .. ':' .. rows[i][1]
      reply[#reply + 1] = rows[i][2]
    end
  end
end
return reply
