-- purge: delete up to LIMIT tasks in the given states, every trace of them.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] limit: most tasks deleted by this call (the client loops: each call stays short)
-- ARGV[2..] states: 'ready', 'delayed', 'inflight' (live leases), 'expired' (leases that ran
--           out), 'dead' (at least one)
-- Reply: {deleted}; fewer than limit means nothing is left in those states.
-- Dedup keys held by a deleted task are released at once (not kept for key_ttl): a purged
-- task did not run. Deleting an in-flight task takes its lease away: its consumer's ack,
-- nack or extend then finds no lease (LeaseLost). Resending after a lost reply is harmless
-- (it deletes what is left), though the lost reply's count is then missing from the total.
local limit = tonumber(ARGV[1])
local now = now_ms()
local want = {}
for i = 2, #ARGV do want[ARGV[i]] = true end
local due = fmt(score(now, 9))
local deleted = 0

local function purge(key, ids)
  if #ids == 0 then return end
  redis.call('ZREM', key, unpack(ids))
  if key == K_INFLIGHT then lease_ended(ids, now) end
  hist_ended(ids, now, 'purged')  -- [H]
  for _, id in ipairs(ids) do forget(id, now, false) end
  task_ended(ids, now, 'purged')
  deleted = deleted + #ids
end

if want['ready'] and want['delayed'] then
  purge(K_DELAYED, redis.call('ZRANGE', K_DELAYED, 0, limit - 1))
elseif want['ready'] then
  purge(K_DELAYED, redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', due, 'LIMIT', 0, limit))
elseif want['delayed'] then
  purge(K_DELAYED,
    redis.call('ZRANGEBYSCORE', K_DELAYED, '(' .. due, '+inf', 'LIMIT', 0, limit))
end
-- [L] Due tasks waiting in their limit keys' lines are ready too.
flow_probe()
if want['ready'] and deleted < limit and (flow_seen.lim or flow_seen.task) then
  local keys = redis.call('ZRANGE', flow_key('lim:ready'), 0, -1)
  for _, k in ipairs(redis.call('ZRANGE', flow_key('lim:gate'), 0, -1)) do keys[#keys + 1] = k end
  for _, k in ipairs(redis.call('SMEMBERS', flow_key('lim:full'))) do keys[#keys + 1] = k end
  for _, k in ipairs(keys) do
    if deleted >= limit then break end
    if k ~= '*' then
      purge(parked_key(k), redis.call('ZRANGE', parked_key(k), 0, limit - deleted - 1))
    end
  end
end
local lapsed = '(' .. fmt(score(now, 0))
if want['inflight'] and want['expired'] and deleted < limit then
  purge(K_INFLIGHT, redis.call('ZRANGE', K_INFLIGHT, 0, limit - deleted - 1))
elseif want['inflight'] and deleted < limit then
  purge(K_INFLIGHT, redis.call('ZRANGEBYSCORE', K_INFLIGHT, fmt(score(now, 0)), '+inf',
    'LIMIT', 0, limit - deleted))
elseif want['expired'] and deleted < limit then
  purge(K_INFLIGHT, redis.call('ZRANGEBYSCORE', K_INFLIGHT, '-inf', lapsed,
    'LIMIT', 0, limit - deleted))
end
if want['dead'] and deleted < limit then
  purge(K_DEAD, redis.call('ZRANGE', K_DEAD, 0, limit - deleted - 1))
end
count('purged', deleted)
return {deleted}
