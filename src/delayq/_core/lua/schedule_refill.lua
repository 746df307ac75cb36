-- schedule_refill: append cron times a client computed, after the schedule's last known
-- one (a checked write: any number of clients may race, and one of an old version is refused).
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] name   ARGV[2] version the times were computed for
-- ARGV[3] 1 if the spec has no times after these (its end, or a date that never recurs)
-- ARGV[4] the tzdata version the times were computed with ('' = unknown), recorded with the
--         schedule when they are added   ARGV[5..] times, epoch ms, increasing
-- Reply: {added, version, the tzdata version recorded before}; added -1 = refused (another
--        version, or the schedule is removed or moved)
local name, ver = ARGV[1], ARGV[2]
local now = now_ms()
local st = sched_state(name)
if st.ver ~= ver or st.gone == '1' then return {-1, tonumber(st.ver or '0'), ''} end
local at_key = sched_key('sched:at:' .. name)
local floor = tonumber(st.cursor)
local tail = redis.call('ZRANGE', at_key, -1, -1)
if tail[1] and tonumber(tail[1]) > floor then floor = tonumber(tail[1]) end
local fields = {}
for i = 5, #ARGV do
  local t = tonumber(ARGV[i])
  if t > floor then
    fields[#fields + 1] = ARGV[i]
    fields[#fields + 1] = ARGV[i]
    floor = t
  end
end
if #fields > 0 then
  redis.call('ZADD', at_key, unpack(fields))
  redis.call('HSET', sched_key('sched:st:' .. name), 'tzv', ARGV[4])
end
if ARGV[3] == '1' then
  redis.call('HSET', sched_key('sched:st:' .. name), 'exh', 1)
  st.exh = '1'
end
if st.paused ~= '1' and st.done ~= '1' then sched_plan(name, st, now) end
return {#fields / 2, tonumber(ver), st.tzv or ''}
