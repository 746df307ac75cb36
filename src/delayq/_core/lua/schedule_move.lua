-- schedule_move: carry schedules from one (sub-)queue to another during a reshard
-- (docs/schedules.md, "Resharding"). Each action runs on one side, so on one slot; the mover
-- (Python) calls 'take' on the old side, then 'land' on the new one. Both are safe to run
-- again: a schedule taken before is a tombstone that still holds what it carried, and a
-- landing finds the schedule already there.
-- KEYS:  the queue key set of the (sub-)queue the action runs on (see _lib.lua).
-- ARGV[1] action:
--   'away'   ARGV[2] '1' = this (sub-)queue is being left: upserts of new schedules here are
--            refused (the writer reads the layout again); '0' = it is current again
--   'names'  the schedules to carry. Reply {live names, names of removed schedules whose
--            tombstones are still kept}
--   'take'   ARGV[2] name, ARGV[3] the (sub-)queue it goes to, ARGV[4] ms to keep the
--            tombstone: out of the chain in one step (its fire not yet due dropped, its time
--            given back to the cursor, as an edit does), marked moved so that a writer who
--            still routes here is sent on. Reply {0} = no such schedule, or {1, state hash as
--            a flat list, cron times ahead, fires held by the overlap policy, trigger and
--            backfill requests as a flat list (request, stored reply, ms left; the latest
--            1000), the ms its state has left to live (-1 = no TTL)}
--   'land'   ARGV[2] name, ARGV[3] the (sub-)queue it comes from, then counted lists: the
--            state (n, then n field/value pairs), the cron times (n, times), the held fires
--            (n, entries), the requests (n, then n triples), and the ms its tombstone has
--            left (0 = it was live). Checked: the cursor never goes back, a schedule already
--            here of that version or a later one is kept. Reply {status, version, cron times
--            ahead}; status 0 = it was here already, 1 = landed live, 2 = landed a tombstone
--   'settle' ARGV[2] name, then what the old side's tombstone holds now: ARGV[3] its fires
--            alive, ARGV[4] its missed count, ARGV[5] last_out, ARGV[6] last_end,
--            ARGV[7] last_ok. The fires that ended there leave the overlap count here (they
--            only decrease it); reply {alive still counted}, -1 = nothing to settle
--   'peek'   ARGV[2] name: its state hash as a flat list, tombstone or not ({} = none)
local action = ARGV[1]
local now = now_ms()
local SCHED_MAX_REQUESTS = 1000  -- the latest trigger/backfill requests carried, at most

-- Fields a landing sets itself, not copied from the old side.
local LOCAL_FIELDS = {gone = true, mv = true, mv_live = true, moved_ms = true, far = true,
  far_q = true, far_missed = true, pend = true, live = true}

local function flat_state(name)
  return redis.call('HGETALL', sched_key('sched:st:' .. name))
end

if action == 'away' then
  if ARGV[2] == '1' then
    redis.call('SET', sched_key('sched:away'), '1')
  else
    redis.call('DEL', sched_key('sched:away'))
  end
  return 1
elseif action == 'names' then
  local gone = sched_key('sched:gone')
  redis.call('ZREMRANGEBYSCORE', gone, '-inf', fmt(now))
  return {redis.call('HKEYS', sched_key('sched')), redis.call('ZRANGE', gone, 0, -1)}
elseif action == 'peek' then
  return flat_state(ARGV[2])
end

local name = ARGV[2]
local st_key = sched_key('sched:st:' .. name)
local at_key = sched_key('sched:at:' .. name)
local buf_key = sched_key('sched:buf:' .. name)
local reqs_key = sched_key('sched:reqs:' .. name)

if action == 'take' then
  if redis.call('EXISTS', st_key) == 0 then return {0} end
  local keep = tonumber(ARGV[4])
  local moved_buf = sched_key('sched:mbuf:' .. name)
  if not redis.call('HGET', st_key, 'mv') then
    local live = redis.call('HGET', st_key, 'gone') ~= '1'
    if live then
      -- Dropping the fire made ahead of its time ends it as 'cancelled': not an outcome of
      -- the schedule's, so the last one is kept.
      local last = redis.call('HMGET', st_key, 'last_out', 'last_end')
      sched_drop_pending(name, now)
      redis.call('HDEL', st_key, 'pend')
      if last[1] then redis.call('HSET', st_key, 'last_out', last[1]) end
      if last[2] then redis.call('HSET', st_key, 'last_end', last[2]) end
    end
    redis.call('HSET', st_key, 'gone', 1, 'mv', ARGV[3], 'mv_live', live and 1 or 0,
      'moved_ms', fmt(now))
    if live then redis.call('PEXPIRE', st_key, keep) end  -- a tombstone keeps its own TTL
    redis.call('HDEL', sched_key('sched'), name)
    redis.call('ZREM', sched_key('sched:due'), name)
    redis.call('ZREM', sched_key('sched:gone'), name)
    -- The held fires and cron times stay with the tombstone (a take run again reads them):
    -- no step of this side looks at them any more.
    if redis.call('EXISTS', buf_key) == 1 then redis.call('RENAME', buf_key, moved_buf) end
    for _, key in ipairs({moved_buf, at_key, reqs_key}) do
      if redis.call('EXISTS', key) == 1 then redis.call('PEXPIRE', key, keep) end
    end
  end
  local requests = {}
  local kept = redis.call('ZREVRANGEBYSCORE', reqs_key, '+inf', '(' .. fmt(now), 'LIMIT', 0,
    SCHED_MAX_REQUESTS)
  for _, request in ipairs(kept) do
    local req_key = sched_key('sched:req:' .. name .. ':' .. request)
    local stored, left = redis.call('GET', req_key), redis.call('PTTL', req_key)
    if stored and left > 0 then
      requests[#requests + 1] = request
      requests[#requests + 1] = stored
      requests[#requests + 1] = left
    end
  end
  return {1, flat_state(name), redis.call('ZRANGE', at_key, 0, -1),
    redis.call('LRANGE', moved_buf, 0, -1), requests, redis.call('PTTL', st_key)}
elseif action == 'land' then
  local i = 4
  local function counted(width)
    local n, items = tonumber(ARGV[i]), {}
    for k = i + 1, i + n * width do items[#items + 1] = ARGV[k] end
    i = i + n * width + 1
    return items
  end
  local pairs_ = counted(2)
  local carried = {}
  for k = 1, #pairs_, 2 do carried[pairs_[k]] = pairs_[k + 1] end
  local times, held, requests = counted(1), counted(1), counted(3)
  local tomb_ms = tonumber(ARGV[i])
  local here = redis.call('HMGET', st_key, 'ver', 'mv', 'cursor')
  local here_ver, here_cursor = tonumber(here[1] or '0'), tonumber(here[3] or '0')
  local cursor = math.max(tonumber(carried.cursor or '0'), here_cursor)
  if here[1] and not here[2] and here_ver >= tonumber(carried.ver) then
    -- Landed before (a move run again), or upserted, edited or removed here since: keep
    -- it, but never let its cursor stay behind the carried one (a time accepted there is
    -- refused here too). A tombstone of a schedule that moved away from here is replaced.
    if cursor > here_cursor then
      redis.call('HSET', st_key, 'cursor', fmt(cursor))
      redis.call('ZREMRANGEBYSCORE', at_key, '-inf', fmt(cursor))
    end
    return {0, here_ver, redis.call('ZCARD', at_key)}
  end
  local ver = math.max(tonumber(carried.ver), here_ver)
  redis.call('DEL', st_key, at_key, buf_key)
  local fields = {}
  for field, value in pairs(carried) do
    if not LOCAL_FIELDS[field] then
      fields[#fields + 1] = field
      fields[#fields + 1] = value
    end
  end
  redis.call('HSET', st_key, unpack(fields))
  redis.call('HSET', st_key, 'ver', ver, 'cursor', fmt(cursor))
  for k = 1, #requests, 3 do
    local req_key = sched_key('sched:req:' .. name .. ':' .. requests[k])
    redis.call('SET', req_key, requests[k + 1], 'PX', tonumber(requests[k + 2]), 'NX')
    redis.call('ZADD', reqs_key, fmt(now + tonumber(requests[k + 2])), requests[k])
  end
  if tomb_ms > 0 then  -- a removed schedule: its tombstone, with the time it had left
    redis.call('HSET', st_key, 'gone', 1, 'live', 0)
    redis.call('PEXPIRE', st_key, tomb_ms)
    redis.call('ZADD', sched_key('sched:gone'), fmt(now + tomb_ms), name)
    return {2, ver, 0}
  end
  -- The fires still alive on the old side count as running here (the overlap policy) until
  -- 'settle' sees them end there.
  local far = tonumber(carried.live or '0')
  redis.call('HSET', st_key, 'gone', 0, 'live', far)
  if far > 0 then
    redis.call('HSET', st_key, 'far', far, 'far_q', ARGV[3], 'far_missed',
      carried.missed or '0')
  end
  redis.call('PERSIST', st_key)
  redis.call('HSET', sched_key('sched'), name, ver)
  local ahead = {}
  for _, t in ipairs(times) do
    if tonumber(t) > cursor then
      ahead[#ahead + 1] = t
      ahead[#ahead + 1] = t
    end
  end
  if #ahead > 0 then redis.call('ZADD', at_key, unpack(ahead)) end
  if #held > 0 then redis.call('RPUSH', buf_key, unpack(held)) end
  local st = sched_state(name)
  if st.paused ~= '1' and st.done ~= '1' then sched_plan(name, st, now) end
  if far == 0 and #held > 0 then sched_release(name, now) end
  return {1, ver, redis.call('ZCARD', at_key)}
elseif action == 'settle' then
  local st = sched_state(name)
  if not st.ver or st.gone == '1' or not st.far then return {-1} end
  local far = tonumber(st.far)
  local alive = math.min(math.max(tonumber(ARGV[3]), 0), far)
  local live = tonumber(st.live or '0')
  if alive < far then
    live = math.max(live - (far - alive), 0)
    redis.call('HSET', st_key, 'live', live, 'far', alive)
  end
  local missed, base = tonumber(ARGV[4]), tonumber(st.far_missed or '0')
  if missed > base then
    redis.call('HINCRBY', st_key, 'missed', missed - base)
    redis.call('HSET', st_key, 'far_missed', fmt(missed))
  end
  if ARGV[5] ~= '' and (tonumber(ARGV[6]) or 0) > tonumber(st.last_end or '0') then
    redis.call('HSET', st_key, 'last_out', ARGV[5], 'last_end', ARGV[6])
  end
  if (tonumber(ARGV[7]) or 0) > tonumber(st.last_ok or '0') then
    redis.call('HSET', st_key, 'last_ok', ARGV[7])
  end
  if alive == 0 then
    redis.call('HDEL', st_key, 'far', 'far_q', 'far_missed')
    if live == 0 then sched_release(name, now) end
  end
  return {alive}
end
return redis.error_reply('ERR unknown schedule move action ' .. tostring(action))
