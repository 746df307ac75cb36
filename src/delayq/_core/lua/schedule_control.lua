-- schedule_control: pause, resume, remove, trigger or backfill one schedule.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] name   ARGV[2] action:
--   'pause'    ARGV[3] note
--   'resume'   the fires that fell in the pause are skipped (backfill replays them)
--   'remove'   ARGV[3] ms to keep the tombstone (cursor and version): a lagging refill is
--              refused, and a schedule re-created with the name goes on from the cursor
--   'trigger'  ARGV[3] request id: one fire now, id s:<name>:m:<request>, obeying the
--              overlap policy; the cursor is left alone
--   'backfill' ARGV[3] request id, ARGV[4..] nominal times: one fire each, due now, ids
--              s:<name>:b:<request>:<ms>, whatever the overlap policy
--   ARGV[3] / ARGV[4] for trigger and backfill: ms to remember the request (a retry of the
--   same request, e.g. after a lost reply, does nothing again)
-- Reply: {status, detail}: status -1 = no such schedule, -2 = a reshard moved it (detail =
--        the (sub-)queue it went to: the caller reads the layout again); pause/resume/remove: 1 = done,
--        0 = it was so already; trigger: 1 = fired, 2 = held back (buffered), 0 = skipped
--        (overlap, then or by the same request before), 3 = done before (the same request);
--        detail = the fire id;
--        backfill: 1 with detail = fires offered, or 3 = done before
local name, action = ARGV[1], ARGV[2]
local now = now_ms()
local st_key = sched_key('sched:st:' .. name)
local st = sched_state(name)
if st.mv then return {-2, st.mv} end
if not st.ver or st.gone == '1' then return {-1, ''} end
local due_key = sched_key('sched:due')

if action == 'pause' then
  if st.paused == '1' then return {0, ''} end
  sched_drop_pending(name, now)  -- a fire made ahead of its time does not run in the pause
  redis.call('HSET', st_key, 'paused', 1, 'note', ARGV[3], 'paused_ms', fmt(now))
  redis.call('ZREM', due_key, name)
  return {1, ''}
elseif action == 'resume' then
  if st.paused ~= '1' then return {0, ''} end
  local cursor = math.max(tonumber(st.cursor), now)
  st.cursor = fmt(cursor)
  redis.call('HSET', st_key, 'paused', 0, 'note', '', 'cursor', st.cursor)
  redis.call('ZREMRANGEBYSCORE', sched_key('sched:at:' .. name), '-inf', st.cursor)
  if st.done ~= '1' then sched_plan(name, st, now) end
  if tonumber(st.live or '0') <= 0 then sched_release(name, now) end  -- one held in the pause
  return {1, ''}
elseif action == 'remove' then
  sched_drop_pending(name, now)
  redis.call('HSET', st_key, 'gone', 1, 'removed_ms', fmt(now))
  redis.call('PEXPIRE', st_key, tonumber(ARGV[3]))
  redis.call('ZADD', sched_key('sched:gone'), fmt(now + tonumber(ARGV[3])), name)
  redis.call('HDEL', sched_key('sched'), name)
  redis.call('ZREM', due_key, name)
  redis.call('DEL', sched_key('sched:at:' .. name), sched_key('sched:buf:' .. name))
  return {1, ''}
end

local request = ARGV[3]
local req_key = sched_key('sched:req:' .. name .. ':' .. request)
local earlier = redis.call('GET', req_key)
if earlier then
  local status, detail = string.match(earlier, '^(%d)|(.*)$')
  return {status == '0' and 0 or 3, detail}  -- a skipped trigger is skipped again
end
-- Remember the request, and list it where a reshard finds it to carry (schedule_move.lua).
local function remember(reply, ms)
  redis.call('SET', req_key, reply, 'PX', ms)
  local listed = sched_key('sched:reqs:' .. name)
  redis.call('ZREMRANGEBYSCORE', listed, '-inf', fmt(now))
  redis.call('ZADD', listed, fmt(now + ms), request)
  redis.call('PEXPIRE', listed, ms)
end
if action == 'trigger' then
  local id = 's:' .. name .. ':m:' .. request
  local outcome = sched_admit(name, st, id, now)
  local status = 0
  if outcome == 'fire' then
    sched_offer(name, st, id, now, now)
    status = 1
  elseif outcome == 'held' then
    status = 2
  else
    redis.call('HINCRBY', st_key, 'skipped', 1)
  end
  if status > 0 then redis.call('HINCRBY', st_key, 'manual', 1) end
  remember(status .. '|' .. id, tonumber(ARGV[4]))
  return {status, id}
elseif action == 'backfill' then
  local offered = 0
  for i = 5, #ARGV do
    local id = 's:' .. name .. ':b:' .. request .. ':' .. ARGV[i]
    if sched_offer(name, st, id, tonumber(ARGV[i]), now) then offered = offered + 1 end
  end
  redis.call('HINCRBY', st_key, 'backfilled', offered)
  remember('1|' .. offered, tonumber(ARGV[4]))
  return {1, tostring(offered)}
end
return redis.error_reply('ERR unknown schedule action ' .. action)
