-- limit_admin: set, remove and read the limits of a queue (see _lib.lua's flow-control
-- section for the keys: lim, lim:tat, lim:run, lim:w:<key>, lim:gate, lim:full, all derived
-- from the queue's prefix).
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] 'set', 'remove', 'get' or 'list'
-- ARGV[2] set, remove, get: the limit key ('*' = the whole queue, '~default' = every key
--         without its own)
-- ARGV[3] set: the limit, 'rate|per_us|burst|concurrency|weight' (see _core/limits.py)
-- Reply: set: {1}; remove: {1 = removed, 0 = there was none}; get: one row; list: a row per
--        key that has a limit, tasks waiting or leases running. A row is {key, own limit or
--        '', running, waiting, next admission ms or -1, '1' if a default limit exists or ''}.
-- set and remove put every gated or full key back in line (lim:ready) and wake the
-- consumers: the next fetch starts or holds back each key's tasks under the limits as they
-- now are (one look per key and change).
local op, key = ARGV[1], ARGV[2]
local now = now_ms()
local LIM, RUN = flow_key('lim'), flow_key('lim:run')
local GATE, FULL = flow_key('lim:gate'), flow_key('lim:full')

local function row(k, reply)
  local waiting = k == '*' and 0 or redis.call('ZCARD', parked_key(k))
  local gate = redis.call('ZSCORE', GATE, k)
  reply[#reply + 1] = k
  reply[#reply + 1] = redis.call('HGET', LIM, k) or ''
  reply[#reply + 1] = tonumber(redis.call('HGET', RUN, k) or '0')
  reply[#reply + 1] = waiting
  reply[#reply + 1] = gate and tonumber(gate) or -1
  reply[#reply + 1] = redis.call('HEXISTS', LIM, '~default') == 1 and '1' or ''
end

if op == 'get' then
  local reply = {}
  row(key, reply)
  return reply
end

if op == 'list' then
  local seen, order = {}, {}
  local function note(k)
    if not seen[k] then
      seen[k] = true
      order[#order + 1] = k
    end
  end
  local limits = redis.call('HKEYS', LIM)
  table.sort(limits)
  for _, k in ipairs(limits) do note(k) end
  for _, k in ipairs(redis.call('HKEYS', RUN)) do note(k) end
  for _, k in ipairs(redis.call('ZRANGE', GATE, 0, -1)) do note(k) end
  for _, k in ipairs(redis.call('SMEMBERS', FULL)) do note(k) end
  for _, k in ipairs(redis.call('ZRANGE', flow_key('lim:ready'), 0, -1)) do note(k) end
  local reply = {}
  for _, k in ipairs(order) do row(k, reply) end
  return reply
end

local result = 1
if op == 'set' then
  redis.call('HSET', LIM, key, ARGV[3])
elseif op == 'remove' then
  result = redis.call('HDEL', LIM, key)
  redis.call('HDEL', flow_key('lim:tat'), key)
  for _, reason in ipairs({'rate', 'concurrency', 'ratelimited'}) do
    redis.call('ZREM', flow_key('lim:thr:' .. reason), key)
  end
else
  return redis.error_reply('unknown limit_admin op ' .. tostring(op))
end
local waiting = redis.call('ZRANGE', GATE, 0, -1)
for _, k in ipairs(redis.call('SMEMBERS', FULL)) do waiting[#waiting + 1] = k end
redis.call('DEL', GATE, FULL)
redis.call('HDEL', flow_key('lim:tat'), '~turn')  -- consumers' turns at '*' (fetch.lua)
for _, k in ipairs(waiting) do fair_rejoin(k) end
wake_now(now)
return {result}
