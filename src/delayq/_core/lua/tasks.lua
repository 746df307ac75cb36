-- tasks: list one page of the tasks in one state, read in one consistent step.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] state: 'ready' (due, not handed out), 'delayed' (not due yet), 'inflight' (a live
--         lease), 'expired' (a lease that ran out, not yet reclaimed), 'dead'
-- ARGV[2] offset   ARGV[3] limit
-- Reply: {now, then per task: id, score, attempts, envelope or '', last error or '',
--        ttl deadline ms or ''}; the score's time is the due time (ready, delayed), lease
--        expiry (inflight) or time of death (dead). Order: that time, then priority.
-- Pages by rank (ZRANGE by index), never by scanning: O(log N + limit). 'ready' is the due
-- head of the delayed set and 'delayed' the rest, split at one ZCOUNT of the due part;
-- 'expired' and 'inflight' split the inflight set (by lease expiry) the same way. [L] 'ready'
-- goes on into the tasks waiting in limit keys' lines (O(K) in the keys with tasks waiting).
local state, offset, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local key, first, last = K_DELAYED, offset, offset + limit - 1
if state == 'ready' or state == 'delayed' then
  local due = redis.call('ZCOUNT', K_DELAYED, '-inf', fmt(score(now, 9)))
  if state == 'ready' then
    if last > due - 1 then last = due - 1 end
  else
    first, last = first + due, last + due
  end
elseif state == 'inflight' or state == 'expired' then
  key = K_INFLIGHT
  local lapsed = redis.call('ZCOUNT', K_INFLIGHT, '-inf', '(' .. fmt(score(now, 0)))
  if state == 'expired' then
    if last > lapsed - 1 then last = lapsed - 1 end
  else
    first, last = first + lapsed, last + lapsed
  end
elseif state == 'dead' then
  key = K_DEAD
else
  return redis.error_reply('unknown task state ' .. state)
end
local reply = {now}
local rows = {}
if last >= first then rows = redis.call('ZRANGE', key, first, last, 'WITHSCORES') end
if state == 'ready' then
  -- [L] After the due head of the delayed set, the due tasks waiting in their limit keys'
  -- lines (in line for their turn, gated or at a concurrency cap), key by key.
  flow_probe()
  if flow_seen.lim or flow_seen.task then
    local keys, seen = {}, {}
    local function note(k)
      if k ~= '*' and not seen[k] then
        seen[k] = true
        keys[#keys + 1] = k
      end
    end
    for _, k in ipairs(redis.call('ZRANGE', flow_key('lim:ready'), 0, -1)) do note(k) end
    for _, k in ipairs(redis.call('ZRANGE', flow_key('lim:gate'), 0, -1)) do note(k) end
    for _, k in ipairs(redis.call('SMEMBERS', flow_key('lim:full'))) do note(k) end
    table.sort(keys)
    local due = redis.call('ZCOUNT', K_DELAYED, '-inf', fmt(score(now, 9)))
    local skip, take = math.max(0, offset - due), limit - #rows / 2
    for _, k in ipairs(keys) do
      if take <= 0 then break end
      local n = redis.call('ZCARD', parked_key(k))
      if skip >= n then
        skip = skip - n
      else
        local line = redis.call('ZRANGE', parked_key(k), skip, skip + take - 1, 'WITHSCORES')
        for _, v in ipairs(line) do rows[#rows + 1] = v end
        take = take - #line / 2
        skip = 0
      end
    end
  end
end
if #rows == 0 then return reply end
local ids = {}
for i = 1, #rows, 2 do ids[#ids + 1] = rows[i] end
local envelopes = redis.call('HMGET', K_TASKS, unpack(ids))
local attempts = redis.call('HMGET', K_ATTEMPTS, unpack(ids))
local errors = redis.call('HMGET', K_ERRORS, unpack(ids))
local deadlines = redis.call('ZMSCORE', K_EXPIRY, unpack(ids))
for k, id in ipairs(ids) do
  local n = #reply
  reply[n + 1] = id
  reply[n + 2] = rows[2 * k]
  reply[n + 3] = tonumber(attempts[k] or '0')
  reply[n + 4] = envelopes[k] or ''
  reply[n + 5] = errors[k] or ''
  reply[n + 6] = deadlines[k] or ''
end
return reply
